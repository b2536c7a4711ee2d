/* What fastpar_r.c shares with the other .Call glue (fastpar_r_embed.c, fastpar_r_chat.c): the
 * handles' tags and owners, failures as R values, stats and the interrupt poll's clock; each is
 * described where fastpar_r.c defines it. */
#ifndef FASTPAR_R_H
#define FASTPAR_R_H

#include <Rinternals.h>

#include "fastpar.h"

SEXP context_tag(void);
void results_finalizer(SEXP ptr);
SEXP owner(SEXP tag, SEXP keep, R_CFinalizer_t finalizer);
void * handle(SEXP ptr, SEXP tag, const char * what);
SEXP failure(fastpar_status status);
SEXP stats_list(const fastpar_stats * s);
extern double g_next_poll;

SEXP fastpar_r_embed(SEXP ctx_ptr, SEXP texts, SEXP normalize, SEXP query);

/* fastpar_r_chat.c */
fastpar_prompt * r_prompts(SEXP prompts);
SEXP tool_calls_frame(const fastpar_completion * c);

#endif
