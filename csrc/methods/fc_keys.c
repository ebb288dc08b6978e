/* fc_keys.c: a key table's defaults and named settings written into a config struct, for the
 * config parser (python/fc_config.c) and for methods that build other methods' configs
 * (adaptive's ladder), so a default is written in one place: the key table. */
#include <string.h>
#include "methods/fc_method.h"

void fc_keys_defaults(const fc_key *keys, void *cfg)
{
    for (const fc_key *k = keys; k->name != NULL; k++) {
        char *p = (char *)cfg + k->offset;
        switch (k->kind) {
        case FC_KEY_BOOL:
        case FC_KEY_CHOICE:
            *(int *)p = (int)k->def;
            break;
        case FC_KEY_INT:
            *(int64_t *)p = (int64_t)k->def;
            break;
        case FC_KEY_FLOAT:
            *(double *)p = k->def;
            break;
        default:
            break;
        }
    }
}

int fc_keys_set(const fc_key *keys, void *cfg, const char *name, double value, const char *choice,
                fc_err *err)
{
    for (const fc_key *k = keys; k->name != NULL; k++) {
        if (strcmp(k->name, name) != 0)
            continue;
        char *p = (char *)cfg + k->offset;
        if (k->kind == FC_KEY_CHOICE && choice != NULL) {
            for (int i = 0; k->choices[i] != NULL; i++)
                if (strcmp(k->choices[i], choice) == 0) {
                    *(int *)p = i;
                    return FC_OK;
                }
            return fc_fail(err, FC_ERR_VALUE, "key '%s' has no choice '%s'", name, choice);
        }
        if ((k->kind == FC_KEY_INT || k->kind == FC_KEY_BOOL) && choice == NULL &&
            value >= k->lo && value <= k->hi) {
            if (k->kind == FC_KEY_INT)
                *(int64_t *)p = (int64_t)value;
            else
                *(int *)p = (int)value;
            return FC_OK;
        }
        return fc_fail(err, FC_ERR_VALUE, "key '%s' cannot be set to %g%s%s", name, value,
                       choice ? " / " : "", choice ? choice : "");
    }
    return fc_fail(err, FC_ERR_VALUE, "no key '%s'", name);
}
