/* fc_config.h: parses a method's JSON-like config dict against its key tables. */
#ifndef FC_CONFIG_H
#define FC_CONFIG_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "driver/fc_core.h"
#include "methods/fc_method.h"

/* The keys every method takes, stored in fc_common, and the removed ones (FC_REMOVED). */
extern const fc_key fc_common_keys[];

/* Fills common + method cfg from `config` (a dict or None). Every key of the dict must be a
 * common key or one of the method's; each value is type- and range-checked. */
int fc_config_parse(const fc_method *m, PyObject *config, fc_common *common, void *cfg, fc_err *err);
/* The hash of the method and of every key that decides what goes on the wire (all but the
 * FC_KEY_LOCAL ones), as values: the same on every rank that runs the same config. */
uint32_t fc_config_fingerprint(const fc_method *m, const fc_common *common, const void *cfg);
/* {key: value} of those keys, into `into` (what the ranks compare before they exchange). */
int fc_config_wire_dict(const fc_method *m, const fc_common *common, const void *cfg,
                        PyObject *into);
/* {key: value} of everything resolved, defaults included, into `into`. */
int fc_config_to_dict(const fc_key *keys, const void *src, PyObject *into);
/* {name: the ValueError's message} of the removed common keys (FC_REMOVED), for the checks
 * outside the C parser (powersgd's keys) and the checkpoints written before they went. */
PyObject *fc_removed_keys(void);
/* [{name, type, default, min, max, choices, doc}] describing a key table. */
PyObject *fc_keys_info(const fc_key *keys);
/* [{name, type, same_as, min, max, doc}]: the other names method m takes for a value (num_bits),
 * which every list of its valid keys shows; same_as is the key it sets (None: a fixed value). */
PyObject *fc_aliases_info(const fc_method *m);

#endif
