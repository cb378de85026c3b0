/* The outputs of `tessera characterize` from its cell records: cells.csv (one row per
 * cell, the columns below), summary.json, report.md (the paper's findings next to the
 * measured ones, with the n x n arithmetic) and PNG plots drawn by gnuplot when it is
 * installed. A record is a flat JSON object whose keys are the columns (null: unknown). */
#ifndef TSR_JOBS_CHAR_REPORT_H
#define TSR_JOBS_CHAR_REPORT_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "base/status.h"
#include "jobs/study/study.h"

typedef struct tsr_char_col {
    const char *name;
    const char *unit; /* "" for none */
    const char *help;
} tsr_char_col;

extern const tsr_char_col tsr_char_cols[];
extern const size_t tsr_char_n_cols;

/* Writes cells.csv, summary.json, report.md and the plots into dir from records[n] (one
 * per cell, in the study's order). Lines about what could not be drawn go to stderr. */
tsr_status tsr_char_report(const tsr_study *s, cJSON *const *records, size_t n, const char *dir,
                           double study_wall_s, const char *self_exe);

#endif
