#include "core/loop/prefix_cache.hpp"

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/base/errors.hpp"
#include "core/base/params.hpp"
#include "core/loop/prefix_sharing.hpp"
#include "core/model/model.hpp"

namespace fastpar {

// Adds the time of a save or restore (llama.cpp's state copies: with the KV cache on a GPU,
// device-to-host copies at admission) to the stats, so that their cost can be measured.
class PrefixCache::HostCopyTimer {
public:
    explicit HostCopyTimer(PrefixCache & cache) : cache_(cache), t0_(std::chrono::steady_clock::now()) {}
    ~HostCopyTimer() {
        const std::chrono::duration<double, std::milli> t = std::chrono::steady_clock::now() - t0_;
        std::lock_guard<std::mutex> lock(cache_.stats_mutex_);
        cache_.stats_.t_host_ms += t.count();
    }

private:
    PrefixCache & cache_;
    std::chrono::steady_clock::time_point t0_;
};

namespace {

// Selective saving (a KV cache in GPU memory). A save copies the sequence out while the
// device waits (~9 MB for the speed model's 82 tokens). With every prompt new, such saves are
// all the cache adds, and the server with its cache on made 0.52-0.60x the tokens/s of the
// cache off on an H200 (docs/internals.md, "The prefix cache"). A save pays only if a later
// prompt reuses it, so sequences are saved while recent prompts were restored from host
// memory or would have taken at least half of an unsaved sequence: kReuseWeight for each
// such prompt, a mean decaying at each candidate for saving, at least kReuseFloor (one such
// prompt in the last ~6 candidates). The unsaved are remembered by their tokens, within bounds.
constexpr double kReuseWeight = 1.0 / 8;
constexpr double kReuseFloor = 1.0 / 16;
constexpr size_t kMaxUnsaved = 256;
constexpr size_t kMaxUnsavedTokens = size_t{1} << 18;

}  // namespace

PrefixCache::PrefixCache(size_t n_slots, int64_t budget_bytes, size_t min_tokens, bool selective)
    : min_tokens_(std::max<size_t>(1, min_tokens)), budget_(std::max<int64_t>(0, budget_bytes)), selective_(selective),
      held_(n_slots), held_since_(n_slots, 0) {
    stats_.budget_bytes = budget_;
}

void PrefixCache::hold(size_t seq, std::vector<llama_token> tokens) {
    held_[seq] = std::move(tokens);
    held_since_[seq] = ++clock_;
    update_counts();
}

void PrefixCache::release(size_t seq) {
    if (!held_[seq].empty()) {
        held_[seq].clear();
        update_counts();
    }
}

void PrefixCache::move_held(size_t from, size_t to) {
    held_[to] = std::move(held_[from]);
    held_[from].clear();
    held_since_[to] = held_since_[from];
}

CacheMatch PrefixCache::longest_on_host(const std::vector<llama_token> & prompt, size_t limit) const {
    CacheMatch best;
    for (size_t i = 0; i < host_.size(); ++i) {
        const size_t n = std::min(common_prefix(prompt, host_[i].tokens), limit);
        if (n > best.n) {
            best.n = n;
            best.host = static_cast<int32_t>(i);
        }
    }
    return best;
}

bool PrefixCache::long_enough(size_t seq) const { return budget_ > 0 && held_[seq].size() >= min_tokens_; }

bool PrefixCache::saving_now() const {
    // The mean as worth_saving leaves it, decayed by this candidate.
    return !selective_ || reuse_ * (1.0 - kReuseWeight) >= kReuseFloor;
}

bool PrefixCache::may_save(size_t seq) const { return long_enough(seq) && saving_now(); }

bool PrefixCache::worth_saving(size_t seq, size_t kept) {
    if (!long_enough(seq)) {
        return false;
    }
    const std::vector<llama_token> & t = held_[seq];
    // A sequence most of which another slot or entry holds too (the same few-shot prefix
    // with another short question) would spend the budget on copies of one prefix.
    size_t covered = kept;
    for (size_t s = 0; s < held_.size(); ++s) {
        if (s != seq) {
            covered = std::max(covered, common_prefix(t, held_[s]));
        }
    }
    for (const HostEntry & e : host_) {
        covered = std::max(covered, common_prefix(t, e.tokens));
    }
    const size_t unique = t.size() - covered;
    if (unique < min_tokens_ || unique * 2 < t.size()) {
        return false;
    }
    if (!selective_) {
        return true;
    }
    const bool saving = saving_now();
    reuse_ *= 1.0 - kReuseWeight;
    if (saving) {
        return true;
    }
    unsaved_.push_back(t);
    unsaved_tokens_ += t.size();
    while (unsaved_.size() > kMaxUnsaved || unsaved_tokens_ > kMaxUnsavedTokens) {
        unsaved_tokens_ -= unsaved_.front().size();
        unsaved_.pop_front();
    }
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++stats_.n_not_saved;
    return false;
}

void PrefixCache::note_prompt(const std::vector<llama_token> & prompt, size_t got) {
    if (!selective_) {
        return;
    }
    for (auto it = unsaved_.begin(); it != unsaved_.end(); ++it) {
        const size_t n = common_prefix(prompt, *it);
        if (n >= got + min_tokens_ && n * 2 >= it->size()) {
            reuse_ = std::min(1.0, reuse_ + kReuseWeight);
            unsaved_tokens_ -= it->size();
            unsaved_.erase(it);
            return;
        }
    }
}

bool PrefixCache::save(llama_context * ctx, size_t seq) {
    const HostCopyTimer timer(*this);
    const auto id = static_cast<llama_seq_id>(seq);
    const size_t size = llama_state_seq_get_size(ctx, id);
    if (size == 0 || static_cast<int64_t>(size) > budget_) {
        return false;
    }
    // Entries the new one extends (an earlier turn of the same conversation) are superseded.
    for (size_t i = host_.size(); i-- > 0;) {
        if (common_prefix(host_[i].tokens, held_[seq]) == host_[i].tokens.size()) {
            drop_host(i);
        }
    }
    evict_to(static_cast<int64_t>(size));
    HostEntry e;
    e.state.resize(size);
    if (llama_state_seq_get_data(ctx, e.state.data(), size, id) != size) {
        update_counts();
        return false;
    }
    e.tokens = held_[seq];
    e.last_used = ++clock_;
    host_.push_back(std::move(e));
    {
        std::lock_guard<std::mutex> lock(stats_mutex_);
        ++stats_.n_saved;
    }
    update_counts();
    return true;
}

void PrefixCache::let_go(llama_context * ctx, size_t seq) {
    if (worth_saving(seq, 0)) {
        save(ctx, seq);
    }
    release(seq);
}

bool PrefixCache::restore(llama_context * ctx, int32_t host, size_t seq) {
    const HostCopyTimer timer(*this);
    HostEntry & e = host_[static_cast<size_t>(host)];
    const size_t n = llama_state_seq_set_data(ctx, e.state.data(), e.state.size(), static_cast<llama_seq_id>(seq));
    if (n == 0) {
        llama_memory_seq_rm(llama_get_memory(ctx), static_cast<llama_seq_id>(seq), -1, -1);
        drop_host(static_cast<size_t>(host));
        update_counts();
        return false;
    }
    e.last_used = ++clock_;
    changed_ = true;  // the folder's order of recency
    reuse_ = std::min(1.0, reuse_ + kReuseWeight);
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++stats_.n_restored;
    return true;
}

void PrefixCache::count_hit(size_t n) {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    ++stats_.n_hits;
    stats_.n_tokens_reused += static_cast<int64_t>(n);
}

void PrefixCache::evict_to(int64_t bytes_free) {
    int64_t used = 0;
    for (const HostEntry & e : host_) {
        used += static_cast<int64_t>(e.state.size());
    }
    while (!host_.empty() && used + bytes_free > budget_) {
        const auto lru = std::min_element(host_.begin(), host_.end(), [](const HostEntry & a, const HostEntry & b) {
            return a.last_used < b.last_used;
        });
        used -= static_cast<int64_t>(lru->state.size());
        drop_host(static_cast<size_t>(lru - host_.begin()));
        std::lock_guard<std::mutex> lock(stats_mutex_);
        ++stats_.n_evicted;
    }
}

void PrefixCache::drop_host(size_t i) {
    host_.erase(host_.begin() + static_cast<std::ptrdiff_t>(i));
}

void PrefixCache::clear(llama_context * ctx) {
    remove_files();
    host_.clear();
    host_.shrink_to_fit();
    unsaved_.clear();
    unsaved_tokens_ = 0;
    reuse_ = 0;
    for (size_t seq = 0; seq < held_.size(); ++seq) {
        if (!held_[seq].empty()) {
            llama_memory_seq_rm(llama_get_memory(ctx), static_cast<llama_seq_id>(seq), -1, -1);
            held_[seq].clear();
        }
    }
    update_counts();
}

void PrefixCache::update_counts() {
    changed_ = true;  // every change of what is held passes here
    int64_t slots = 0, tokens = 0, host_tokens = 0, bytes = 0;
    for (const auto & h : held_) {
        slots += h.empty() ? 0 : 1;
        tokens += static_cast<int64_t>(h.size());
    }
    for (const HostEntry & e : host_) {
        host_tokens += static_cast<int64_t>(e.tokens.size());
        bytes += static_cast<int64_t>(e.state.size());
    }
    std::lock_guard<std::mutex> lock(stats_mutex_);
    stats_.n_slots_held = slots;
    stats_.n_tokens_held = tokens;
    stats_.n_host_entries = static_cast<int64_t>(host_.size());
    stats_.n_host_tokens = host_tokens;
    stats_.bytes_host = bytes;
}

// -- the folder -------------------------------------------------------------------------------
//
// One file an entry: "FPPCACHE", a format version, the identity, the tokens and
// llama_state_seq_get_data's bytes. A file is written beside its name and renamed over it,
// so a reader never sees half of one.

namespace {

constexpr char kMagic[8] = {'F', 'P', 'P', 'C', 'A', 'C', 'H', 'E'};
constexpr uint32_t kFormat = 1;
constexpr const char * kSuffix = ".fpcache";

struct File {
    std::FILE * f = nullptr;
    explicit File(const std::string & path, const char * mode) : f(std::fopen(path.c_str(), mode)) {}
    ~File() {
        if (f != nullptr) {
            std::fclose(f);
        }
    }
    bool write(const void * p, size_t n) { return std::fwrite(p, 1, n, f) == n; }
    bool read(void * p, size_t n) { return std::fread(p, 1, n, f) == n; }
};

template <typename T> bool put(File & f, T v) { return f.write(&v, sizeof v); }
template <typename T> bool get(File & f, T & v) { return f.read(&v, sizeof v); }

// Reads a file's identity; false if it is no cache file of this format.
bool read_identity(File & f, std::string & identity) {
    char magic[8];
    uint32_t format = 0, n = 0;
    if (!f.read(magic, sizeof magic) || std::memcmp(magic, kMagic, sizeof magic) != 0 || !get(f, format) ||
        format != kFormat || !get(f, n) || n > (1u << 16)) {
        return false;
    }
    identity.resize(n);
    return f.read(identity.data(), n);
}

// A file name from the tokens (FNV-1a): the same sequence always lands in the same file.
std::string file_name(const std::vector<llama_token> & tokens) {
    uint64_t h = 1469598103934665603ull;
    for (llama_token t : tokens) {
        h = (h ^ static_cast<uint32_t>(t)) * 1099511628211ull;
    }
    char name[32];
    std::snprintf(name, sizeof name, "%016llx", static_cast<unsigned long long>(h));
    return std::string(name) + kSuffix;
}

std::vector<std::filesystem::path> cache_files(const std::string & dir) {
    std::vector<std::filesystem::path> out;
    std::error_code ec;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        if (it->path().extension() == kSuffix && it->is_regular_file(ec)) {
            out.push_back(it->path());
        }
    }
    return out;
}

}  // namespace

void PrefixCache::keep_in(const std::string & dir, const std::string & identity) {
    dir_ = dir;
    identity_ = identity;
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    // Newest first: those are loaded while the budget lasts.
    std::vector<std::pair<std::filesystem::file_time_type, std::filesystem::path>> files;
    for (const auto & p : cache_files(dir_)) {
        files.emplace_back(std::filesystem::last_write_time(p, ec), p);
    }
    std::sort(files.begin(), files.end(), [](const auto & a, const auto & b) { return a.first > b.first; });
    int64_t used = 0, loaded = 0, refused = 0;
    for (const auto & [time, path] : files) {
        File f(path.string(), "rb");
        std::string id;
        uint32_t n_tokens = 0;
        uint64_t n_bytes = 0;
        HostEntry e;
        bool ok = f.f != nullptr && read_identity(f, id) && id == identity_ && get(f, n_tokens) &&
                  n_tokens > 0 && n_tokens <= (1u << 24);
        if (ok) {
            e.tokens.resize(n_tokens);
            ok = f.read(e.tokens.data(), n_tokens * sizeof(llama_token)) && get(f, n_bytes) && n_bytes > 0 &&
                 n_bytes <= static_cast<uint64_t>(budget_);
        }
        if (ok && used + static_cast<int64_t>(n_bytes) > budget_) {
            continue;  // of this identity, but no room: left on disk
        }
        if (ok) {
            e.state.resize(n_bytes);
            ok = f.read(e.state.data(), n_bytes);
        }
        if (!ok) {
            ++refused;  // another model, KV type or build, or a damaged file: never loaded
            continue;
        }
        used += static_cast<int64_t>(n_bytes);
        e.last_used = ++clock_;
        host_.push_back(std::move(e));
        ++loaded;
    }
    std::reverse(host_.begin(), host_.end());  // the oldest is the least recently used
    for (size_t i = 0; i < host_.size(); ++i) {
        host_[i].last_used = i + 1;
    }
    {
        std::lock_guard<std::mutex> lock(stats_mutex_);
        stats_.n_loaded += loaded;
        stats_.n_refused += refused;
    }
    update_counts();
    changed_ = false;  // memory holds what the folder holds
}

void PrefixCache::persist(llama_context * ctx) {
    // An Engine writes when it closes and its context again when freed: once is enough.
    if (dir_.empty() || !changed_) {
        return;
    }
    changed_ = false;
    // What the idle slots hold, then the host entries, newest first, within the budget.
    struct Out {
        const std::vector<llama_token> * tokens;
        std::vector<uint8_t> held;        // a slot's state, read now
        const std::vector<uint8_t> * state;
    };
    std::vector<Out> out;
    for (size_t seq = 0; seq < held_.size(); ++seq) {
        if (held_[seq].empty()) {
            continue;
        }
        Out o{&held_[seq], {}, nullptr};
        const auto id = static_cast<llama_seq_id>(seq);
        o.held.resize(llama_state_seq_get_size(ctx, id));
        if (o.held.empty() || llama_state_seq_get_data(ctx, o.held.data(), o.held.size(), id) != o.held.size()) {
            continue;
        }
        out.push_back(std::move(o));
    }
    std::vector<const HostEntry *> host;
    for (const HostEntry & e : host_) {
        host.push_back(&e);
    }
    std::sort(host.begin(), host.end(), [](const HostEntry * a, const HostEntry * b) { return a->last_used > b->last_used; });
    for (const HostEntry * e : host) {
        out.push_back(Out{&e->tokens, {}, &e->state});
    }
    remove_files();
    int64_t used = 0;
    for (const Out & o : out) {
        const std::vector<uint8_t> & state = o.state != nullptr ? *o.state : o.held;
        if (used + static_cast<int64_t>(state.size()) > budget_) {
            continue;
        }
        const std::string path = (std::filesystem::path(dir_) / file_name(*o.tokens)).string();
        bool ok;
        {
            File f(path + ".tmp", "wb");
            ok = f.f != nullptr && f.write(kMagic, sizeof kMagic) && put(f, kFormat) &&
                 put(f, static_cast<uint32_t>(identity_.size())) && f.write(identity_.data(), identity_.size()) &&
                 put(f, static_cast<uint32_t>(o.tokens->size())) &&
                 f.write(o.tokens->data(), o.tokens->size() * sizeof(llama_token)) &&
                 put(f, static_cast<uint64_t>(state.size())) && f.write(state.data(), state.size());
        }
        std::error_code ec;
        if (ok) {
            std::filesystem::rename(path + ".tmp", path, ec);
            used += static_cast<int64_t>(state.size());
        } else {
            std::filesystem::remove(path + ".tmp", ec);  // a full disk: the cache stays in memory
            changed_ = true;                              // and the next persist() tries again
        }
    }
}

void PrefixCache::remove_files() const {
    if (dir_.empty()) {
        return;
    }
    for (const auto & p : cache_files(dir_)) {
        bool ours;
        {
            File f(p.string(), "rb");
            std::string id;
            ours = f.f != nullptr && read_identity(f, id) && id == identity_;
        }
        if (ours) {
            std::error_code ec;
            std::filesystem::remove(p, ec);  // another identity's files stay, whoever made them
        }
    }
}

PrefixCacheStats PrefixCache::stats() const {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    return stats_;
}

// Host memory the prefix cache may take (ContextParams::prefix_cache_mib): the budget asked
// for, or with -1 a quarter of the memory available now (MemAvailable: free memory and what
// the kernel can reclaim), at most kAutoPrefixCacheMaxMib.
int64_t prefix_cache_budget(int32_t mib) {
    constexpr int64_t kMib = 1 << 20;
    if (mib >= 0) {
        return static_cast<int64_t>(mib) * kMib;
    }
    int64_t available = 0;
    if (std::FILE * f = std::fopen("/proc/meminfo", "r")) {
        char line[256];
        while (std::fgets(line, sizeof line, f) != nullptr) {
            long long kib = 0;
            if (std::sscanf(line, "MemAvailable: %lld kB", &kib) == 1) {
                available = static_cast<int64_t>(kib) * 1024;
                break;
            }
        }
        std::fclose(f);
    }
#if defined(_SC_AVPHYS_PAGES) && defined(_SC_PAGESIZE)
    if (available <= 0) {
        available = static_cast<int64_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
    }
#endif
    return std::min(std::max<int64_t>(0, available / 4), kAutoPrefixCacheMaxMib * kMib);
}

// What a prefix-cache file must match to be loaded: fastpar's and llama.cpp's builds and
// backend, the model file (its size and a hash of its first and last 4 MiB and of 64 KiB
// at each 64th of it: a fine-tune of the same shape differs there), and the KV types.
std::string prefix_cache_identity(const Model & model, const ContextParams & params) {
    std::FILE * f = std::fopen(model.path().c_str(), "rb");
    if (f == nullptr) {
        throw Error("prefix_cache_dir: cannot read the model file " + model.path() + " to fingerprint it");
    }
    std::fseek(f, 0, SEEK_END);
    const long long size = std::ftell(f);
    uint64_t h = 1469598103934665603ull;
    std::vector<unsigned char> buf(4 << 20);
    auto hash_at = [&](long long at, size_t n) {
        at = std::max(0LL, std::min(at, size));
        std::fseek(f, static_cast<long>(at), SEEK_SET);
        const size_t got = std::fread(buf.data(), 1, std::min<size_t>(n, buf.size()), f);
        for (size_t i = 0; i < got; ++i) {
            h = (h ^ buf[i]) * 1099511628211ull;
        }
    };
    hash_at(0, 4 << 20);
    for (int i = 1; i < 64; ++i) {
        hash_at(size / 64 * i, 64 << 10);
    }
    hash_at(size - (4 << 20), 4 << 20);
    std::fclose(f);
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    return std::string("fastpar ") + FASTPAR_VERSION + ", llama.cpp " + FASTPAR_LLAMA_COMMIT + ", " +
           backend_name() + "; model " + std::to_string(size) + " bytes " + hex + "; KV " + params.type_k + "/" +
           params.type_v;
}

}  // namespace fastpar
