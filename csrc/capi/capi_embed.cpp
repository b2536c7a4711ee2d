// The C ABI's embeddings and reranking (fastpar_embed, fastpar_rerank): an embeddings
// context's texts, or a reranker's (query, document) pairs, through Context::embed.
#include <string>
#include <vector>

#include "capi_internal.hpp"
#include "core/base/text.hpp"

using namespace fastpar_capi;

extern "C" {

fastpar_status fastpar_embed(fastpar_context * ctx, const char * const * texts, int32_t n_texts, bool normalize,
                             fastpar_completion ** results_out) {
    return guard([&] {
        if (ctx == nullptr || results_out == nullptr) {
            return fail(FASTPAR_ERR_INVALID_ARGUMENT, "ctx and results_out must not be NULL");
        }
        if (!live().has(ctx, Kind::Context)) {
            return not_live("ctx");
        }
        const std::vector<fastpar::Prompt> in = text_prompts(texts, n_texts, "texts");
        if (!ctx->ctx->params().embeddings) {
            return fail(FASTPAR_ERR_INVALID_ARGUMENT,
                        "this context was made for generation: make one with embeddings = true to embed");
        }
        if (n_texts == 0) {
            *results_out = nullptr;
            return FASTPAR_OK;
        }
        fastpar::EmbedParams ep;
        ep.normalize = normalize;
        *results_out = to_c(ctx->ctx->embed(in, ep, ctx->interrupt_check()));
        return FASTPAR_OK;
    });
}

fastpar_status fastpar_rerank(fastpar_context * ctx, const char * query, const char * const * documents,
                              int32_t n_documents, fastpar_completion ** results_out) {
    return guard([&] {
        if (ctx == nullptr || query == nullptr || results_out == nullptr) {
            return fail(FASTPAR_ERR_INVALID_ARGUMENT, "ctx, query and results_out must not be NULL");
        }
        if (!live().has(ctx, Kind::Context)) {
            return not_live("ctx");
        }
        const std::vector<fastpar::Prompt> docs = text_prompts(documents, n_documents, "documents");
        if (ctx->ctx->pooling() != "rank") {
            return fail(FASTPAR_ERR_INVALID_ARGUMENT,
                        "this context does not rerank: make one with embeddings = true and pooling \"rank\" "
                        "(a reranker's GGUF names it)");
        }
        if (n_documents == 0) {
            *results_out = nullptr;
            return FASTPAR_OK;
        }
        const std::string q = query;
        if (fastpar::utf8_sanitize(q) != q) {
            return fail(FASTPAR_ERR_INVALID_ARGUMENT, "query is not valid UTF-8");
        }
        // Each pair as llama-server's /rerank makes it. A document that is not valid UTF-8
        // goes in as the text it is, which the embeddings step refuses alone.
        std::vector<fastpar::Prompt> pairs(docs.size());
        for (size_t i = 0; i < docs.size(); ++i) {
            if (fastpar::utf8_sanitize(docs[i].text) != docs[i].text) {
                pairs[i] = docs[i];
                continue;
            }
            pairs[i].is_tokens = true;
            pairs[i].tokens = ctx->ctx->model()->rerank_prompt(q, docs[i].text);
        }
        fastpar::EmbedParams ep;
        ep.normalize = false;
        *results_out = to_c(ctx->ctx->embed(pairs, ep, ctx->interrupt_check()));
        return FASTPAR_OK;
    });
}

}  // extern "C"
