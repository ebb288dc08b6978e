/* fc_adaptive.h: adaptive's ladder, the codecs a parts table chooses from (m_adaptive.c), for the
 * glue that shows it to Python (fsdpcomp._budget.LADDER must equal it: tests/core/test_adaptive.py). */
#ifndef FC_ADAPTIVE_H
#define FC_ADAPTIVE_H

#define FC_ADAPTIVE_RUNGS 12
#define FC_RUNG_SETS 4

/* One key a rung sets over its method's defaults: an INT to `value`, or a CHOICE to `choice`. */
typedef struct {
    const char *key; /* NULL: unused slot */
    double value;
    const char *choice;
} fc_rung_set;

typedef struct {
    const char *name;   /* as tables and _budget.LADDER show it */
    const char *method; /* a method of the table (methods.c) */
    fc_rung_set set[FC_RUNG_SETS];
} fc_rung;

extern const fc_rung fc_adaptive_ladder[FC_ADAPTIVE_RUNGS];

#endif
