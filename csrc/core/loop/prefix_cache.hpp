// The prefix cache: what a finished request leaves in the KV cache outlives it and its call.
// A slot that finishes keeps its sequence (prompt and generated tokens) while it is idle;
// when a new prompt needs the slot, a sequence worth keeping moves to host memory
// (llama_state_seq_get_data), least recently used entries going first under a byte budget.
// A new prompt takes the idle slot whose sequence starts like it the longest way, or gets a
// longer prefix restored from host memory into its slot, and decodes only the rest.
// Reuse is exact: only positions whose tokens are identical, from position 0, are kept,
// so a prompt sees no other request's state but the KV of the same token prefix
// (docs/design.md, "Cleanup"). The Context owns the cache; each call's Scheduler uses it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "llama.h"

namespace fastpar {

class Model;
struct ContextParams;

// Host memory the prefix cache may take (ContextParams::prefix_cache_mib): the budget asked
// for, or with -1 a quarter of the memory available now, at most kAutoPrefixCacheMaxMib.
int64_t prefix_cache_budget(int32_t mib);

// What a prefix-cache file must match to be loaded (PrefixCache::keep_in): fastpar's and
// llama.cpp's builds and backend, the model file and the KV types.
std::string prefix_cache_identity(const Model & model, const ContextParams & params);

// What the cache holds and did, since the context was made (clear() keeps the counts).
struct PrefixCacheStats {
    int64_t n_hits = 0;             // prompts that started from a cached prefix
    int64_t n_tokens_reused = 0;    // prompt tokens taken from the cache instead of decoded
    int64_t n_slots_held = 0;       // idle slots holding a cached sequence now
    int64_t n_tokens_held = 0;      // positions those slots hold in the KV cache
    int64_t n_host_entries = 0;     // sequences kept in host memory now
    int64_t n_host_tokens = 0;      // their tokens
    int64_t bytes_host = 0;         // host memory they take
    int64_t budget_bytes = 0;       // most host memory they may take
    int64_t n_saved = 0;            // sequences moved to host memory
    int64_t n_restored = 0;         // host entries copied back into a slot
    double t_host_ms = 0;           // time spent copying sequences to host memory and back
    int64_t n_evicted = 0;          // host entries dropped to stay within the budget
    int64_t n_not_saved = 0;        // sequences left unsaved while saved ones went unused (GPU)
    int64_t n_loaded = 0;           // entries read from the cache's folder (prefix_cache_dir)
    int64_t n_refused = 0;          // files there made by another model, KV type or build, or damaged
};

// Where a prompt's longest cached prefix is.
struct CacheMatch {
    size_t n = 0;        // tokens it has in common with the prompt
    int32_t host = -1;   // a host entry's index, or -1: a slot's
};

class PrefixCache {
public:
    // `n_slots` slots; host entries take at most `budget_bytes` (0: none are kept, slots
    // still keep theirs); a prefix shorter than `min_tokens` is decoded again. `selective`
    // where a save stalls the device (a KV cache in GPU memory): sequences are then saved
    // only while later prompts reuse what was saved, or would have (worth_saving).
    PrefixCache(size_t n_slots, int64_t budget_bytes, size_t min_tokens, bool selective);

    // Tokens a prompt may take from a match of `n`: a prefix shorter than min_tokens is
    // decoded again (0).
    size_t reusable(size_t n) const { return n >= min_tokens_ ? n : 0; }
    // Whether a prompt starts from host memory's match `host` rather than the `n` reusable
    // tokens its slot holds: there is one, longer by at least min_tokens.
    bool host_beats(const CacheMatch & host, size_t n) const { return host.host >= 0 && host.n >= n + min_tokens_; }
    // Whether saving is selective (the constructor's `selective`; tests set it on a CPU).
    void set_selective(bool on) { selective_ = on; }
    // The tokens slot `seq`'s KV holds while it is idle (empty: none).
    const std::vector<llama_token> & held(size_t seq) const { return held_[seq]; }
    // Slot `seq` finished and keeps `tokens` (its prompt and fed tokens) in its KV.
    void hold(size_t seq, std::vector<llama_token> tokens);
    // Slot `seq` lost what it held (its KV is being cleared or reused).
    void release(size_t seq);
    // Slot `from`'s held sequence was copied into idle slot `to`, which held nothing.
    void move_held(size_t from, size_t to);

    // The longest prefix of `prompt` held in host memory, up to `limit` tokens.
    CacheMatch longest_on_host(const std::vector<llama_token> & prompt, size_t limit) const;
    // When slot `seq` last finished (a count; 0: it holds nothing): the least recently
    // used idle slot is the one reused first.
    uint64_t held_since(size_t seq) const { return held_[seq].empty() ? 0 : held_since_[seq]; }
    // Whether slot `seq`'s held sequence should move to host memory before the slot is
    // reused with its first `kept` tokens kept: it is long enough, enough of it is held
    // nowhere else, and (selective) recent prompts reused saved or unsaved sequences.
    bool worth_saving(size_t seq, size_t kept);
    // Whether letting slot `seq`'s held sequence go might save it to host memory: it is long
    // enough and the cache saves now (every candidate, or recent prompts reused saved or
    // unsaved sequences). Cheap (compaction asks every step) and counts nothing; worth_saving
    // may still say no (a sequence held elsewhere too).
    bool may_save(size_t seq) const;
    // Selective: a prompt that got `got` tokens from the cache notes whether an unsaved
    // sequence would have given it more (evidence that saving pays). Before worth_saving.
    void note_prompt(const std::vector<llama_token> & prompt, size_t got);
    // Moves slot `seq`'s held sequence to host memory (its KV stays, for the caller to reuse
    // or clear), evicting least recently used entries to stay within the budget. Returns
    // false if it did not fit or llama.cpp gave no state. Entries it drops move the others:
    // a host index found before it is stale after it.
    bool save(llama_context * ctx, size_t seq);
    // Marks host entry `host` the most recently used, so that a save evicts it last.
    void touch(int32_t host) { host_[static_cast<size_t>(host)].last_used = ++clock_; }
    // Slot `seq`'s held sequence leaves the device for good (nothing of it is kept there):
    // saved first if worth_saving(seq, 0), then released. The caller clears the KV.
    void let_go(llama_context * ctx, size_t seq);
    // Copies host entry `host` into slot `seq` (whose sequence must be empty); touches it.
    // Returns false if llama.cpp refused the state (the entry is then dropped).
    bool restore(llama_context * ctx, int32_t host, size_t seq);

    // A prompt started from `n` cached tokens.
    void count_hit(size_t n);
    // Removes what idle slots hold from the KV cache and drops every host entry. Call it
    // between steps (the slots of running requests hold nothing here).
    void clear(llama_context * ctx);

    PrefixCacheStats stats() const;

    // Keeps the cache in folder `dir` across restarts: its files carry `identity` (the model
    // file, the KV types, fastpar's and llama.cpp's builds), and only files of the same
    // identity are read. Reads them now into host memory, newest first, within the budget;
    // every other file is refused (counted), never loaded.
    void keep_in(const std::string & dir, const std::string & identity);
    // Writes what the idle slots hold and every host entry to the folder, newest first within
    // the budget, replacing the folder's earlier files of this identity. Between steps.
    void persist(llama_context * ctx);

private:
    class HostCopyTimer;
    struct HostEntry {
        std::vector<llama_token> tokens;
        std::vector<uint8_t> state;  // llama_state_seq_get_data's bytes
        uint64_t last_used = 0;
    };
    void evict_to(int64_t bytes_free);
    // may_save's and worth_saving's shared rules, so the two cannot drift apart: a sequence
    // long enough to keep (and a budget), and the saving mode (every candidate, or while the
    // reuse mean, decayed by one more candidate, stays at least kReuseFloor).
    bool long_enough(size_t seq) const;
    bool saving_now() const;
    void remove_files() const;  // the folder's files of this identity
    void drop_host(size_t i);
    void update_counts();

    size_t min_tokens_;
    int64_t budget_;
    bool selective_;
    double reuse_ = 0;  // selective: prompts reusing a saved or unsaved sequence, per candidate (decaying mean)
    std::deque<std::vector<llama_token>> unsaved_;  // selective: recent sequences not saved (tokens only)
    size_t unsaved_tokens_ = 0;
    uint64_t clock_ = 0;
    std::vector<std::vector<llama_token>> held_;  // per slot
    std::vector<uint64_t> held_since_;            // per slot
    std::vector<HostEntry> host_;
    std::string dir_;       // "" = kept in memory only
    std::string identity_;
    bool changed_ = false;  // since the folder was read or written: persist() has work
    mutable std::mutex stats_mutex_;  // stats_ is read from other threads (metrics)
    PrefixCacheStats stats_;
};

}  // namespace fastpar
