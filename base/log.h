/* Logging to stderr with levels and an optional "[rank r]" prefix. */
#ifndef TSR_BASE_LOG_H
#define TSR_BASE_LOG_H

typedef enum tsr_log_level {
    TSR_LOG_ERROR = 0,
    TSR_LOG_WARN = 1,
    TSR_LOG_INFO = 2,
    TSR_LOG_DEBUG = 3,
} tsr_log_level;

void tsr_log_set_level(tsr_log_level level);
tsr_log_level tsr_log_get_level(void);
/* rank < 0: no prefix (single process). */
void tsr_log_set_rank(int rank);
void tsr_log(tsr_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define TSR_LOG_ERROR(...) tsr_log(TSR_LOG_ERROR, __VA_ARGS__)
#define TSR_LOG_WARN(...) tsr_log(TSR_LOG_WARN, __VA_ARGS__)
#define TSR_LOG_INFO(...) tsr_log(TSR_LOG_INFO, __VA_ARGS__)
#define TSR_LOG_DEBUG(...) tsr_log(TSR_LOG_DEBUG, __VA_ARGS__)

#endif
