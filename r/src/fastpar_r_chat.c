/* .Call glue for chat prompts and tool calls over fastpar.h (the rules of fastpar_r.c hold
 * here): R's prompts as fastpar_prompt structs, and a result's calls as a data.frame. */
#include <stdbool.h>
#include <string.h>

#include <R.h>
#include <Rinternals.h>

#include "fastpar.h"
#include "fastpar_r.h"

/* prompts: a list (R's .prompts()), each entry one string (raw text), or a chat:
 * list(roles, contents), or with tool calls list(roles, contents, tool_call_ids, calls):
 * calls[[j]] NULL or list(ids, names, arguments), a content NA where an assistant's message
 * has calls only, an id NA where the message answers none. In R-owned memory (R_alloc),
 * which R releases even on an error. */
fastpar_prompt * r_prompts(SEXP prompts) {
    const R_xlen_t n_prompts = Rf_xlength(prompts);
    fastpar_prompt * in = (fastpar_prompt *) R_alloc((size_t) n_prompts + 1, sizeof(fastpar_prompt));
    for (R_xlen_t i = 0; i < n_prompts; ++i) {
        SEXP p = VECTOR_ELT(prompts, i);
        memset(&in[i], 0, sizeof in[i]);
        if (TYPEOF(p) == STRSXP) {
            in[i].text = Rf_translateCharUTF8(STRING_ELT(p, 0));
        } else {
            SEXP roles = VECTOR_ELT(p, 0), contents = VECTOR_ELT(p, 1);
            const bool tools = Rf_length(p) == 4;
            const int n_messages = Rf_length(roles);
            fastpar_message * messages = (fastpar_message *) R_alloc((size_t) n_messages + 1, sizeof(fastpar_message));
            for (int j = 0; j < n_messages; ++j) {
                memset(&messages[j], 0, sizeof messages[j]);
                messages[j].role = Rf_translateCharUTF8(STRING_ELT(roles, j));
                SEXP content = STRING_ELT(contents, j);
                messages[j].content = content == NA_STRING ? NULL : Rf_translateCharUTF8(content);
                if (!tools) {
                    continue;
                }
                SEXP id = STRING_ELT(VECTOR_ELT(p, 2), j);
                messages[j].tool_call_id = id == NA_STRING ? NULL : Rf_translateCharUTF8(id);
                SEXP calls = VECTOR_ELT(VECTOR_ELT(p, 3), j);
                if (calls == R_NilValue) {
                    continue;
                }
                SEXP ids = VECTOR_ELT(calls, 0), fn = VECTOR_ELT(calls, 1), args = VECTOR_ELT(calls, 2);
                const int n_calls = Rf_length(fn);
                fastpar_tool_call * out = (fastpar_tool_call *) R_alloc((size_t) n_calls + 1, sizeof(fastpar_tool_call));
                for (int c = 0; c < n_calls; ++c) {
                    out[c].id = STRING_ELT(ids, c) == NA_STRING ? NULL : Rf_translateCharUTF8(STRING_ELT(ids, c));
                    out[c].name = Rf_translateCharUTF8(STRING_ELT(fn, c));
                    out[c].arguments = Rf_translateCharUTF8(STRING_ELT(args, c));
                }
                messages[j].tool_calls = out;
                messages[j].n_tool_calls = n_calls;
            }
            in[i].messages = messages;
            in[i].n_messages = n_messages;
        }
    }
    return in;
}

/* A result's tool calls as a data.frame with character columns id, name and arguments (no
 * rows when it made none). */
SEXP tool_calls_frame(const fastpar_completion * c) {
    const char * names[] = {"id", "name", "arguments", ""};
    SEXP frame = PROTECT(Rf_mkNamed(VECSXP, names));
    for (int col = 0; col < 3; ++col) {
        SEXP v = Rf_allocVector(STRSXP, c->n_tool_calls);
        SET_VECTOR_ELT(frame, col, v);
        for (int32_t t = 0; t < c->n_tool_calls; ++t) {
            const fastpar_tool_call * call = &c->tool_calls[t];
            const char * s = col == 0 ? call->id : col == 1 ? call->name : call->arguments;
            SET_STRING_ELT(v, t, Rf_mkCharCE(s, CE_UTF8));
        }
    }
    SEXP rows = PROTECT(Rf_allocVector(INTSXP, 2)); /* compact row names: c(NA, -n) */
    INTEGER(rows)[0] = NA_INTEGER;
    INTEGER(rows)[1] = -c->n_tool_calls;
    Rf_setAttrib(frame, R_RowNamesSymbol, rows);
    Rf_setAttrib(frame, R_ClassSymbol, Rf_mkString("data.frame"));
    UNPROTECT(2);
    return frame;
}

