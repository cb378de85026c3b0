/* A Jinja2 subset interpreter for chat templates, rendering as transformers renders them:
 * ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the
 * loopcontrols extension, transformers' tojson filter (json.dumps, no HTML escaping),
 * raise_exception and strftime_now. Templates are compiled once (tsr_jinja_parse) and
 * rendered with a context given as a cJSON object (messages, add_generation_prompt,
 * bos_token, ...). A construct this subset lacks is refused at parse time with one line
 * naming it and its line:col; errors while rendering (raise_exception, a type error, a
 * limit) are one line too. Hostile templates meet limits, not crashes: nesting depth,
 * call depth, output size, memory and loop steps. */
#ifndef TSR_RUNTIME_JINJA_H
#define TSR_RUNTIME_JINJA_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct tsr_jinja tsr_jinja;

typedef struct tsr_jinja_opts {
    int64_t now;           /* strftime_now's time (seconds since the epoch, UTC); < 0: now */
    size_t max_output;     /* bytes; 0: 16 MiB */
    size_t max_memory;     /* bytes of values while rendering; 0: 256 MiB */
} tsr_jinja_opts;

/* Compiles template source `src` (len bytes, need not be NUL-terminated). `what` names the
 * template in error lines. TSR_ERR_FORMAT: a syntax error; TSR_ERR_UNSUPPORTED: a construct
 * outside the subset. Both with "what: LINE:COL: ..." as the error text. */
tsr_status tsr_jinja_parse(const char *src, size_t len, const char *what, tsr_jinja **out);

void tsr_jinja_free(tsr_jinja *t);

/* Renders with the variables of `context` (a JSON object; NULL for none). *out is
 * NUL-terminated, owned by the caller (tsr_free). opts may be NULL (defaults). */
tsr_status tsr_jinja_render(const tsr_jinja *t, const cJSON *context,
                            const tsr_jinja_opts *opts, char **out, size_t *len);

#endif
