/* Whole-file reads for the small text inputs tessera parses (configs, tokenizers, prompts,
 * templates). Weights are mmapped by their loaders instead. */
#ifndef TSR_BASE_FILE_H
#define TSR_BASE_FILE_H

#include <stddef.h>

#include "base/status.h"

/* Reads `path` ("-" = stdin) into a NUL-terminated buffer the caller frees with tsr_free.
 * `max` bounds the size (0: no bound); a larger file is TSR_ERR_FORMAT. Streams, so pipes
 * and stdin work. Errors name the file and `what` it is ("tokenizer", "config"). */
tsr_status tsr_file_read(const char *path, const char *what, size_t max, char **out,
                         size_t *len);

#endif
