/* Prints every default of the C ABI, walking fastpar_fields.h's lists: one line per field,
 * "<struct> <name> <value>". A field the list puts in the C ABI that fastpar.h lacks fails
 * to compile. tests/test_fields.py compares the values with the core's. */
#include <stdio.h>

#include "fastpar.h"
#include "fastpar_fields.h"

#define PRINT_INT32(s, p, name) printf("%s %s %d\n", s, #name, (int) p.name);
#define PRINT_INT64(s, p, name) printf("%s %s %lld\n", s, #name, (long long) p.name);
#define PRINT_FLOAT(s, p, name) printf("%s %s %.17g\n", s, #name, (double) p.name);
#define PRINT_BOOL(s, p, name) printf("%s %s %d\n", s, #name, p.name ? 1 : 0);
/* A string prints "none" for NULL, a string list its count. */
#define PRINT_STRING(s, p, name) printf("%s %s %s\n", s, #name, p.name == NULL ? "none" : p.name);
#define PRINT_STRINGS(s, p, name) printf("%s %s %d\n", s, #name, p.name == NULL ? (int) p.n_##name : -1);
#define PRINT_BIASES(s, p, name) PRINT_STRINGS(s, p, name)
#define PRINT_TOKENS(s, p, name) PRINT_STRINGS(s, p, name)
#define PRINT(s, p, name, kind, c) FASTPAR_WHEN(c, PRINT_##kind(s, p, name))

#define PRINT_MODEL(name, kind, c, py, r) PRINT("model", mp, name, kind, c)
#define PRINT_CONTEXT(name, kind, c, py, r) PRINT("context", cp, name, kind, c)
#define PRINT_GENERATE(name, kind, c, py, r) PRINT("generate", gp, name, kind, c)

int main(void) {
    const fastpar_model_params mp = fastpar_model_default_params();
    const fastpar_context_params cp = fastpar_context_default_params();
    const fastpar_generate_params gp = fastpar_generate_default_params();
    FASTPAR_MODEL_FIELDS(PRINT_MODEL)
    FASTPAR_CONTEXT_FIELDS(PRINT_CONTEXT)
    FASTPAR_GENERATE_FIELDS(PRINT_GENERATE)
    return 0;
}
