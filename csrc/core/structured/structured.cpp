#include "core/structured/structured.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <atomic>
#include <bitset>
#include <condition_variable>
#include <functional>
#include <list>
#include <random>
#include <set>
#include <string_view>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/base/errors.hpp"
#include "core/threads/pool.hpp"
#include "json-schema-to-grammar.h"
#include "llama-grammar.h"  // llama.cpp's internals: see "Allowed-token sets by grammar state"

namespace fastpar {
namespace {

using json = nlohmann::ordered_json;

[[noreturn]] void unsupported(const std::string & what, const std::string & path) {
    throw InvalidArgument("json_schema: " + what + " (at " + path + ") is not supported; docs/api.md lists what is");
}

// Keywords that only describe a schema: they constrain nothing, so they are ignored.
const std::set<std::string> & annotations() {
    static const std::set<std::string> k = {"title", "description", "$schema", "$id", "$comment", "default",
                                            "examples", "deprecated", "readOnly", "writeOnly"};
    return k;
}

// The keywords the converter turns into grammar rules that enforce them. Anything else
// would be dropped by it silently, and an output could then fail the schema.
const std::set<std::string> & supported() {
    static const std::set<std::string> k = {
        "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
        "maxItems", "enum", "const", "pattern", "minLength", "maxLength", "format", "minimum", "maximum",
        "exclusiveMinimum", "exclusiveMaximum", "anyOf", "$ref", "$defs", "definitions"};
    return k;
}

bool has_type(const json & node, const char * name) {
    if (!node.contains("type")) {
        return false;
    }
    const json & t = node.at("type");
    if (t.is_string()) {
        return t.get<std::string>() == name;
    }
    if (t.is_array()) {
        return std::any_of(t.begin(), t.end(), [&](const json & x) { return x.is_string() && x.get<std::string>() == name; });
    }
    return false;
}

// Checks one schema node and its children, and rewrites what the converter would
// otherwise drop into what it enforces: a bounded "number" becomes an integer in the
// bounds (the converter bounds integers only).
void check_node(json & node, const std::string & path);

void check_children(json & node, const std::string & path) {
    for (const char * key : {"properties", "$defs", "definitions"}) {
        if (node.contains(key)) {
            json & m = node[key];
            if (!m.is_object()) {
                unsupported(std::string("'") + key + "' that is not an object", path);
            }
            for (auto it = m.begin(); it != m.end(); ++it) {
                check_node(it.value(), path + "/" + key + "/" + it.key());
            }
        }
    }
    for (const char * key : {"items", "prefixItems", "anyOf"}) {
        if (!node.contains(key)) {
            continue;
        }
        json & v = node[key];
        if (v.is_array()) {
            for (size_t i = 0; i < v.size(); ++i) {
                check_node(v[i], path + "/" + key + "/" + std::to_string(i));
            }
        } else {
            check_node(v, path + "/" + key);
        }
    }
    if (node.contains("additionalProperties") && node["additionalProperties"].is_object()) {
        check_node(node["additionalProperties"], path + "/additionalProperties");
    }
}

// The converter alone (no checks).
std::string convert_raw(const std::string & text) { return json_schema_to_grammar(common_json::parse(text)); }

void check_node(json & node, const std::string & path) {
    if (node.is_boolean()) {
        unsupported("a boolean schema", path);
    }
    if (!node.is_object()) {
        throw InvalidArgument("json_schema: a schema must be a JSON object (at " + path + ")");
    }
    size_t n_constraints = 0;
    for (auto it = node.begin(); it != node.end(); ++it) {
        const std::string & key = it.key();
        if (annotations().count(key) != 0) {
            continue;
        }
        if (supported().count(key) == 0) {
            unsupported("'" + key + "'", path);
        }
        if (key != "$defs" && key != "definitions") {
            ++n_constraints;
        }
    }
    // The converter follows $ref and anyOf alone, without the keywords beside them.
    for (const char * key : {"$ref", "anyOf"}) {
        if (node.contains(key) && n_constraints > 1) {
            unsupported(std::string("'") + key + "' with other constraints beside it", path);
        }
    }
    const bool numeric = has_type(node, "integer") || has_type(node, "number");
    for (const char * key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
        if (node.contains(key) && !numeric) {
            unsupported(std::string("'") + key + "' without \"type\": \"integer\" or \"number\"", path);
        }
        if (node.contains(key) && !node.at(key).is_number()) {
            unsupported(std::string("a '") + key + "' that is not a number", path);
        }
    }
    for (const char * key : {"minItems", "maxItems"}) {
        if (node.contains(key) && !has_type(node, "array") && !node.contains("items") && !node.contains("prefixItems")) {
            unsupported(std::string("'") + key + "' without \"type\": \"array\"", path);
        }
    }
    if (node.contains("format")) {
        const json & f = node.at("format");
        static const std::set<std::string> formats = {"date", "time", "date-time", "uuid"};
        if (!f.is_string() || formats.count(f.get<std::string>()) == 0) {
            unsupported("format " + f.dump(), path);
        }
    }
    if (node.contains("required")) {
        const json & r = node.at("required");
        if (!r.is_array()) {
            unsupported("'required' that is not an array", path);
        }
        for (const json & name : r) {
            if (!name.is_string() || !node.contains("properties") || !node.at("properties").contains(name.get<std::string>())) {
                unsupported("a required name without an entry in 'properties' (" + name.dump() + ")", path);
            }
        }
    }
    if (node.contains("pattern")) {
        // The converter turns an anchored regular expression of a common subset into rules,
        // and anything else into "any string" (with a warning): that would not enforce it.
        const json & pattern = node.at("pattern");
        if (!pattern.is_string()) {
            unsupported("a 'pattern' that is not a string", path);
        }
        const std::string p = pattern.get<std::string>();
        if (p.size() < 2 || p.front() != '^' || p.back() != '$') {
            unsupported("pattern " + pattern.dump() + " (anchor it with ^ and $)", path);
        }
        // What the converter makes of a pattern it cannot enforce (an unanchored one).
        static const std::string any_string = convert_raw("{\"type\":\"string\",\"pattern\":\"unanchored\"}");
        const json alone = {{"type", "string"}, {"pattern", pattern}};
        if (convert_raw(alone.dump()) == any_string) {
            unsupported("pattern " + pattern.dump() + " (anchor it with ^ and $, and use the common regex subset)",
                        path);
        }
    }
    if (has_type(node, "number") && !has_type(node, "integer") &&
        (node.contains("minimum") || node.contains("maximum") || node.contains("exclusiveMinimum") ||
         node.contains("exclusiveMaximum"))) {
        json & t = node["type"];
        if (t.is_string()) {
            t = "integer";
        } else {
            for (json & x : t) {
                if (x == "number") {
                    x = "integer";
                }
            }
        }
    }
    check_children(node, path);
}

// Conversions by schema text, for every call and thread (the converter is stateless).
struct Converted {
    std::string grammar;
    std::string error;  // non-empty: InvalidArgument with this message
};

std::mutex g_mutex;
std::unordered_map<std::string, Converted> g_converted;
constexpr size_t kMaxConverted = 256;  // schemas kept; the cache starts over past this

Converted convert(const std::string & schema) {
    Converted c;
    try {
        json root = json::parse(schema);
        check_node(root, "#");
        c.grammar = json_schema_to_grammar(common_json::parse(root.dump()));
    } catch (const InvalidArgument & e) {
        c.error = e.what();
    } catch (const json::exception & e) {
        c.error = std::string("json_schema is not valid JSON: ") + e.what();
    } catch (const std::exception & e) {
        c.error = std::string("json_schema could not be converted to a grammar: ") + e.what();
    }
    return c;
}

Converted converted(const std::string & schema) {
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        auto it = g_converted.find(schema);
        if (it != g_converted.end()) {
            return it->second;
        }
    }
    Converted c = convert(schema);
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_converted.size() >= kMaxConverted) {
        g_converted.clear();
    }
    g_converted.emplace(schema, c);
    return c;
}

}  // namespace

void validate_json_schema(const std::string & schema) {
    const Converted c = converted(schema);
    if (!c.error.empty()) {
        throw InvalidArgument(c.error);
    }
}

std::string constraint_grammar(const GenerateParams & params) {
    if (!params.grammar.empty()) {
        return params.grammar;
    }
    Converted c = converted(params.json_schema);
    if (!c.error.empty()) {
        throw InvalidArgument(c.error);
    }
    return std::move(c.grammar);
}

// ---------------------------------------------------------------------------
// Allowed-token sets by grammar state
// ---------------------------------------------------------------------------
// A grammar's state is its stacks (pointers into its rules) and a partly decoded UTF-8
// character; which tokens it allows next depends on nothing else (llama_grammar_apply_impl).
// JSON-schema grammars revisit a few states constantly (after a key, inside a string), and
// masking a large vocabulary costs milliseconds a row, so each state's set is computed once
// and read by every row of that compilation in that state. The public sampler API hides the
// state, so this file uses llama.cpp's internal grammar header: the vendored llama.cpp is
// pinned (scripts/vendor_llama.py), and a version that changes these declarations fails to
// compile here, the signal to check that the key below still names the whole state.

struct Allowed {
    std::vector<uint64_t> bits;     // bit t: the state allows token t
    std::vector<llama_token> ids;   // every allowed token in order, when at most kListed
    size_t n_allowed = 0;
    bool allows(llama_token t) const {
        const auto u = static_cast<size_t>(t);
        return u / 64 < bits.size() && ((bits[u / 64] >> (u % 64)) & 1U) != 0;
    }
    size_t bytes() const { return bits.size() * sizeof(uint64_t) + ids.size() * sizeof(llama_token); }
};

namespace {

// Sets this small also list their tokens: a refused row then chooses among them alone.
constexpr size_t kListed = 4096;

std::atomic<bool> g_sets_enabled{true};

// Where the characters a grammar's rules tell apart change: every character element compares
// a character with its value, so characters between two consecutive cuts (each value and
// value + 1) are matched alike. Sorted; a property of the rules, computed once per compilation.
std::vector<uint64_t> char_cuts(const llama_grammar & g) {
    std::vector<uint64_t> cuts;
    for (const llama_grammar_rule & rule : g.rules) {
        for (const llama_grammar_element & e : rule) {
            if (e.type == LLAMA_GRETYPE_CHAR || e.type == LLAMA_GRETYPE_CHAR_NOT ||
                e.type == LLAMA_GRETYPE_CHAR_RNG_UPPER || e.type == LLAMA_GRETYPE_CHAR_ALT) {
                cuts.push_back(e.value);
                cuts.push_back(uint64_t{e.value} + 1);
            }
        }
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    return cuts;
}

// The vocabulary arranged for masking it whole (TokenTree::allowed). A grammar without
// token terminals (<[id]>) reads a token's text one character after another, so when it
// allows a token it allows every prefix of that token's text that ends on a whole
// character; conversely a refused prefix refuses every token that starts with it. A
// token's parent is the longest other token its text starts with that decodes to whole
// characters: tokens are masked level by level, parents first, and only the children of
// allowed tokens are read. The first level is read only for the first characters the
// grammar allows, and those are found per class of characters that its rules cannot
// tell apart (a few dozen classes, against 17,804 first characters in a 152k vocabulary).
// So a state that allows few tokens (after a key, in a number: where whole masks are
// needed) reads little of the vocabulary. Each token's text is decoded once, here: the
// grammar's own mask decodes every candidate's text into a new vector at every call,
// about half of a whole mask's time.
struct TokenTree {
    explicit TokenTree(const llama_vocab * vocab) {
        const int32_t n = llama_vocab_n_tokens(vocab);
        const auto at = [](llama_token t) { return static_cast<size_t>(t); };
        std::vector<std::string> pieces(at(n));
        std::vector<char> can_parent(at(n), 0), can_child(at(n), 0);
        kind_.assign(at(n), Kind::Text);
        first_.assign(at(n), 0);
        partial_.assign(at(n), llama_partial_utf8{0, 0});
        for (llama_token t = 0; t < n; ++t) {
            std::string & piece = pieces[at(t)];
            piece = token_text(vocab, t);
            // As the grammar's mask reads it: end-of-generation tokens by their own rule, an
            // empty text or one that starts with NUL never allowed (a NUL ends decoding).
            if (llama_vocab_is_eog(vocab, t)) {
                kind_[at(t)] = Kind::Eog;
                eog_.push_back(t);
            } else if (piece.empty() || piece[0] == '\0') {
                kind_[at(t)] = Kind::Never;
            } else {
                first_[at(t)] = static_cast<uint32_t>(points_.size());
                partial_[at(t)] = decode(piece, points_);
            }
            if (kind_[at(t)] == Kind::Text && (static_cast<uint8_t>(piece[0]) >> 6) == 2) {
                // Starts with a continuation byte: what can follow a partly decoded character.
                continued_.push_back(t);
                continued_start_.push_back(static_cast<uint32_t>(continued_bytes_.size()));
                continued_bytes_ += piece;
            }
            if (kind_[at(t)] != Kind::Text || piece.find('\0') != std::string::npos) {
                continue;
            }
            can_child[at(t)] = 1;
            can_parent[at(t)] = partial_[at(t)].n_remain == 0 ? 1 : 0;  // its text decodes to whole characters
        }
        // In the order of their texts, every token that starts with another's text comes
        // after it, before any text that does not: a stack of the texts the current one
        // starts with (the longest on top) finds each parent in one pass.
        std::vector<llama_token> order;
        order.reserve(at(n));
        for (llama_token t = 0; t < n; ++t) {
            if (can_child[at(t)] != 0) {
                order.push_back(t);
            }
        }
        std::sort(order.begin(), order.end(),
                  [&](llama_token x, llama_token y) { return pieces[at(x)] < pieces[at(y)]; });
        std::vector<llama_token> parent(at(n), -1);
        std::vector<llama_token> above;
        for (const llama_token t : order) {
            const std::string_view text = pieces[at(t)];
            while (!above.empty()) {
                const std::string_view up = pieces[at(above.back())];
                if (up.size() < text.size() && text.compare(0, up.size(), up) == 0) {
                    break;
                }
                above.pop_back();
            }
            if (!above.empty()) {
                parent[at(t)] = above.back();
            }
            if (can_parent[at(t)] != 0) {
                above.push_back(t);
            }
        }
        // Children of each token, and the tokens without a parent by their first character.
        children_start_.assign(at(n) + 1, 0);
        for (llama_token t = 0; t < n; ++t) {
            if (kind_[at(t)] == Kind::Text && parent[at(t)] >= 0) {
                ++children_start_[at(parent[at(t)]) + 1];
            }
        }
        for (size_t i = 0; i < at(n); ++i) {
            children_start_[i + 1] += children_start_[i];
        }
        children_.resize(children_start_[at(n)]);
        std::vector<uint32_t> fill(children_start_.begin(), children_start_.end() - 1);
        for (llama_token t = 0; t < n; ++t) {
            if (kind_[at(t)] == Kind::Text && parent[at(t)] >= 0) {
                children_[fill[at(parent[at(t)])]++] = t;
            }
        }
        std::vector<std::pair<uint32_t, llama_token>> roots;  // (first character, token)
        for (llama_token t = 0; t < n; ++t) {
            if (kind_[at(t)] != Kind::Text || parent[at(t)] >= 0) {
                continue;
            }
            const uint32_t c = points_[first_[at(t)]];
            if (c == 0 && partial_[at(t)].n_remain < 0) {
                continue;  // invalid from a fresh start (a continuation byte first): never allowed there
            }
            if (c == 0) {
                unlettered_.push_back(t);  // no whole first character: always read
            } else {
                roots.emplace_back(c, t);
            }
        }
        std::sort(roots.begin(), roots.end());
        for (const auto & [c, t] : roots) {
            if (leads_.empty() || leads_.back() != c) {
                leads_.push_back(c);
                lead_start_.push_back(static_cast<uint32_t>(rooted_.size()));
            }
            rooted_.push_back(t);
        }
        lead_start_.push_back(static_cast<uint32_t>(rooted_.size()));
        continued_start_.push_back(static_cast<uint32_t>(continued_bytes_.size()));
    }

    // The tokens `g` allows, as a mask of the whole vocabulary would find them (bit t of
    // `bits`). `g` must have no token terminals (tree_serves); `cuts` is char_cuts(g). With
    // `pool`, large levels are masked in slices on its threads.
    void allowed(const llama_grammar & g, const std::vector<uint64_t> & cuts, std::vector<uint64_t> & bits,
                 TaskPool * pool = nullptr) const {
        const auto set = [&](llama_token t) {
            bits[static_cast<size_t>(t) / 64] |= uint64_t{1} << (static_cast<size_t>(t) % 64);
        };
        if (g.stacks.empty()) {
            return;  // nothing can follow (accepting a token into it throws before this)
        }
        // The end of generation: when the grammar may end here (llama_grammar_apply_impl).
        if (std::any_of(g.stacks.begin(), g.stacks.end(), [](const llama_grammar_stack & s) { return s.empty(); })) {
            for (const llama_token t : eog_) {
                set(t);
            }
        }
        if (g.partial_utf8.n_remain > 0) {
            // A partly decoded character: a token whose text does not start with a
            // continuation byte is invalid there, so only those that do are read, each
            // decoded from the partial character.
            std::vector<uint32_t> points;
            std::vector<size_t> first(continued_.size());
            std::vector<llama_partial_utf8> partial(continued_.size());
            for (size_t i = 0; i < continued_.size(); ++i) {
                first[i] = points.size();
                const std::string_view text(continued_bytes_.data() + continued_start_[i],
                                            continued_start_[i + 1] - continued_start_[i]);
                partial[i] = decode(text, points, g.partial_utf8);
            }
            llama_grammar_candidates cur;
            for (size_t i = 0; i < continued_.size(); ++i) {
                cur.push_back(llama_grammar_candidate{i, points.data() + first[i], partial[i], continued_[i]});
            }
            std::vector<char> passed;
            reject(g, cur, passed, pool);
            for (size_t i = 0; i < cur.size(); ++i) {
                if (passed[i] != 0) {
                    set(cur[i].id);
                }
            }
            return;
        }
        // The first characters allowed: the first characters of tokens between two cuts
        // form a class the rules match alike, and one of each class, read alone, answers
        // for it. A class's tokens are one run of rooted_ (sorted by first character).
        std::vector<uint32_t> class_points;    // one character of each class, then 0
        std::vector<size_t> class_leads{0};  // class k: leads_[class_leads[k], class_leads[k + 1])
        for (const uint64_t cut : cuts) {
            const auto at = static_cast<size_t>(std::lower_bound(leads_.begin(), leads_.end(), cut) - leads_.begin());
            if (at > class_leads.back()) {
                class_leads.push_back(at);
            }
        }
        if (leads_.size() > class_leads.back()) {
            class_leads.push_back(leads_.size());
        }
        llama_grammar_candidates cur;
        for (size_t k = 0; k + 1 < class_leads.size(); ++k) {
            class_points.push_back(leads_[class_leads[k]]);
            class_points.push_back(0);
        }
        // Filled first: the candidates point into class_points.
        for (size_t k = 0; k + 1 < class_leads.size(); ++k) {
            cur.push_back(llama_grammar_candidate{k, class_points.data() + 2 * k, llama_partial_utf8{0, 0}, -1});
        }
        std::vector<char> passed;
        reject(g, cur, passed, pool);
        // The first level: tokens without a parent whose first character is allowed.
        cur.clear();
        for (size_t k = 0; k + 1 < class_leads.size(); ++k) {
            if (passed[k] != 0) {
                for (uint32_t j = lead_start_[class_leads[k]]; j < lead_start_[class_leads[k + 1]]; ++j) {
                    append(cur, rooted_[j]);
                }
            }
        }
        for (const llama_token t : unlettered_) {
            append(cur, t);
        }
        // Level after level: the children of the tokens allowed in the one before.
        llama_grammar_candidates next;
        while (!cur.empty()) {
            reject(g, cur, passed, pool);
            next.clear();
            for (size_t i = 0; i < cur.size(); ++i) {
                if (passed[i] == 0) {
                    continue;
                }
                const llama_token t = cur[i].id;
                set(t);
                for (uint32_t j = children_start_[static_cast<size_t>(t)]; j < children_start_[static_cast<size_t>(t) + 1]; ++j) {
                    append(next, children_[j]);
                }
            }
            cur.swap(next);
        }
    }

private:
    // Token t's text, decoded ahead, as the next candidate of `cur` (`index`: its place there).
    void append(llama_grammar_candidates & cur, llama_token t) const {
        const auto u = static_cast<size_t>(t);
        cur.push_back(llama_grammar_candidate{cur.size(), points_.data() + first_[u], partial_[u], t});
    }

    // passed[i]: whether `g` allows candidate i of `cur` (whose `index` is i). What
    // llama_grammar_reject_candidates does: a candidate is refused when every stack refuses
    // it, so each stack reads only those the stacks before it refused. In slices, which
    // keeps the rejection's working vectors small and spreads `cur` over the pool's threads.
    static void reject(const llama_grammar & g, const llama_grammar_candidates & cur, std::vector<char> & passed,
                       TaskPool * pool) {
        passed.assign(cur.size(), 1);
        const auto one = [&](size_t i) {
            const size_t from = i * kSlice;
            const size_t to = std::min(cur.size(), from + kSlice);
            llama_grammar_candidates slice(cur.begin() + static_cast<std::ptrdiff_t>(from),
                                           cur.begin() + static_cast<std::ptrdiff_t>(to));
            for (const llama_grammar_stack & stack : g.stacks) {
                slice = llama_grammar_reject_candidates_for_stack(g.rules, stack, slice);
                if (slice.empty()) {
                    break;
                }
            }
            for (const llama_grammar_candidate & c : slice) {
                passed[c.index] = 0;
            }
        };
        const size_t n_slices = (cur.size() + kSlice - 1) / kSlice;
        if (pool != nullptr && n_slices > 1) {
            pool->run(n_slices, one);
        } else {
            for (size_t i = 0; i < n_slices; ++i) {
                one(i);
            }
        }
    }

    enum class Kind : uint8_t { Text, Eog, Never };
    static constexpr size_t kSlice = 4096;

    std::vector<Kind> kind_;
    std::vector<uint32_t> points_;  // every Text token's code points, each list ended by 0
    std::vector<uint32_t> first_;   // where a token's list starts in points_
    std::vector<llama_partial_utf8> partial_;  // a character its text leaves unfinished
    std::vector<llama_token> eog_;
    std::vector<uint32_t> children_start_;  // token t's children: children_[start[t], start[t + 1])
    std::vector<llama_token> children_;
    std::vector<uint32_t> leads_;        // the first characters of tokens without a parent, in order
    std::vector<uint32_t> lead_start_;   // leads_[i]'s tokens: rooted_[start[i], start[i + 1])
    std::vector<llama_token> rooted_;
    std::vector<llama_token> unlettered_;  // tokens without a parent or a whole first character
    std::vector<llama_token> continued_;   // tokens whose text starts with a continuation byte
    std::vector<uint32_t> continued_start_;  // continued_[i]'s text: continued_bytes_[start[i], start[i + 1])
    std::string continued_bytes_;

    static std::string token_text(const llama_vocab * vocab, llama_token t) {
        // The text the grammar's mask reads: special tokens as text, no space stripped.
        std::string out(16, '\0');
        int32_t got = llama_token_to_piece(vocab, t, out.data(), static_cast<int32_t>(out.size()), 0, true);
        if (got < 0) {
            out.resize(static_cast<size_t>(-got));
            got = llama_token_to_piece(vocab, t, out.data(), static_cast<int32_t>(out.size()), 0, true);
        }
        out.resize(static_cast<size_t>(std::max(got, 0)));
        return out;
    }

    // Appends the code points the grammar reads in `s` after `from` (a character the text
    // before left unfinished, none by default), then a 0, and returns the character left
    // unfinished at its end. The grammar's rules of reading
    // (llama-grammar.cpp): a lead byte's top four bits give the sequence's length and the
    // bytes that follow are taken whatever they are; a continuation byte where a character
    // should start makes the text invalid (no code points, n_remain -1, never allowed); a
    // NUL ends the text.
    static llama_partial_utf8 decode(std::string_view s, std::vector<uint32_t> & out,
                                     llama_partial_utf8 from = llama_partial_utf8{0, 0}) {
        static const int length[16] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4};
        const size_t start = out.size();
        uint32_t value = from.value;
        int n_remain = from.n_remain;
        size_t i = 0;
        // A character the text before left unfinished: continuation bytes finish it.
        while (i < s.size() && s[i] != '\0' && n_remain > 0) {
            const auto next = static_cast<uint8_t>(s[i]);
            if ((next >> 6) != 2) {
                out.push_back(0);
                return llama_partial_utf8{0, -1};
            }
            value = (value << 6) + (next & 0x3FU);
            ++i;
            --n_remain;
        }
        if (from.n_remain > 0 && n_remain == 0) {
            out.push_back(value);
        }
        while (i < s.size() && s[i] != '\0') {
            const auto lead = static_cast<uint8_t>(s[i]);
            n_remain = length[lead >> 4] - 1;
            if (n_remain < 0) {
                out.resize(start);
                out.push_back(0);
                return llama_partial_utf8{0, -1};
            }
            value = lead & ((1U << (7 - n_remain)) - 1);
            ++i;
            while (i < s.size() && s[i] != '\0' && n_remain > 0) {
                value = (value << 6) + (static_cast<uint8_t>(s[i]) & 0x3FU);
                ++i;
                --n_remain;
            }
            if (n_remain == 0) {
                out.push_back(value);
            }
        }
        out.push_back(0);
        return llama_partial_utf8{value, n_remain};
    }
};

// Whether TokenTree::allowed may mask for `g`'s current state.
bool tree_serves(const llama_grammar & g, bool token_terminals) {
    return !token_terminals && !g.awaiting_trigger && g.partial_utf8.n_remain >= 0;
}

bool has_token_terminals(const llama_grammar & g) {
    for (const llama_grammar_rule & rule : g.rules) {
        for (const llama_grammar_element & e : rule) {
            if (e.type == LLAMA_GRETYPE_TOKEN || e.type == LLAMA_GRETYPE_TOKEN_NOT) {
                return true;
            }
        }
    }
    return false;
}

// The set `g`'s state allows: with `tree` (and `cuts`, char_cuts(g)) when tree_serves,
// otherwise with the grammar's own mask of the whole vocabulary.
std::shared_ptr<const Allowed> compute_allowed(const llama_grammar & g, const TokenTree * tree,
                                               const std::vector<uint64_t> * cuts, TaskPool * pool = nullptr) {
    const int32_t n_vocab = llama_vocab_n_tokens(g.vocab);
    auto out = std::make_shared<Allowed>();
    out->bits.assign((static_cast<size_t>(n_vocab) + 63) / 64, 0);
    if (tree != nullptr) {
        tree->allowed(g, *cuts, out->bits, pool);
    } else {
        std::vector<llama_token_data> all(static_cast<size_t>(n_vocab));
        for (int32_t t = 0; t < n_vocab; ++t) {
            all[static_cast<size_t>(t)] = llama_token_data{t, 0.0f, 0.0f};
        }
        llama_token_data_array a{all.data(), all.size(), -1, false};
        llama_grammar_apply_impl(g, &a);  // what the grammar sampler's mask does
        for (size_t t = 0; t < all.size(); ++t) {
            if (all[t].logit != -INFINITY) {
                out->bits[t / 64] |= uint64_t{1} << (t % 64);
            }
        }
    }
    // A word of 64 tokens at a time: most words of a set that lists its tokens are 0.
    for (const uint64_t word : out->bits) {
        out->n_allowed += std::bitset<64>(word).count();
    }
    if (out->n_allowed <= kListed) {
        out->ids.reserve(out->n_allowed);
        for (size_t w = 0; w < out->bits.size(); ++w) {
            for (size_t b = 0; b < 64 && out->bits[w] >> b != 0; ++b) {
                if (((out->bits[w] >> b) & 1U) != 0) {
                    out->ids.push_back(static_cast<llama_token>(w * 64 + b));
                }
            }
        }
    }
    return out;
}

}  // namespace

class AllowedSets {
public:
    AllowedSets(const llama_vocab * vocab, size_t budget, int32_t mask_workers)
        : vocab_(vocab), budget_(budget), mask_workers_(mask_workers) {}

    // The vocabulary's TokenTree, built the first time a whole mask is needed.
    const TokenTree & tree() {
        std::call_once(tree_once_, [&] { tree_ = std::make_unique<TokenTree>(vocab_); });
        return *tree_;
    }

    std::shared_ptr<const Allowed> find(const std::string & key) {
        std::lock_guard<std::mutex> lock(mutex_);
        return find_locked(key);
    }

    // The set of `key`, computed from `g` once: a row that asks while another computes it
    // waits for that one (rows of one step often reach the same state together).
    std::shared_ptr<const Allowed> get(const std::string & key, const llama_grammar & g, bool token_terminals,
                                       const std::vector<uint64_t> & cuts) {
        std::unique_lock<std::mutex> lock(mutex_);
        for (;;) {
            if (auto found = find_locked(key)) {
                return found;
            }
            if (computing_.count(key) == 0) {
                break;
            }
            done_.wait(lock);
        }
        computing_.insert(key);
        lock.unlock();
        std::shared_ptr<const Allowed> set;
        try {
            if (tree_serves(g, token_terminals)) {
                // On the mask pool when no other set is being computed on it.
                std::unique_lock<std::mutex> pool_free(pool_mutex_, std::try_to_lock);
                set = compute_allowed(g, &tree(), &cuts, pool_free.owns_lock() ? mask_pool() : nullptr);
            } else {
                set = compute_allowed(g, nullptr, nullptr);
            }
        } catch (...) {
            lock.lock();
            computing_.erase(key);
            done_.notify_all();
            throw;
        }
        lock.lock();
        computing_.erase(key);
        insert_locked(key, set);
        done_.notify_all();
        return set;
    }

private:
    using Lru = std::list<std::pair<std::string, std::shared_ptr<const Allowed>>>;

    // The threads that mask one state's levels together, started with the first whole mask
    // (none without mask_workers). Under pool_mutex_.
    TaskPool * mask_pool() {
        if (mask_workers_ <= 0) {
            return nullptr;
        }
        if (!mask_pool_) {
            mask_pool_ = std::make_unique<TaskPool>(mask_workers_);
        }
        return mask_pool_.get();
    }

    std::shared_ptr<const Allowed> find_locked(const std::string & key) {
        auto it = index_.find(key);
        if (it == index_.end()) {
            return nullptr;
        }
        lru_.splice(lru_.begin(), lru_, it->second);  // most recently used first
        return it->second->second;
    }

    static size_t cost(const std::string & key, const Allowed & set) { return key.size() + set.bytes() + 64; }

    void insert_locked(const std::string & key, const std::shared_ptr<const Allowed> & set) {
        if (index_.count(key) != 0) {
            return;
        }
        lru_.emplace_front(key, set);
        index_.emplace(key, lru_.begin());
        bytes_ += cost(key, *set);
        while (bytes_ > budget_ && lru_.size() > 1) {  // rows still reading one hold it
            const auto & last = lru_.back();
            bytes_ -= cost(last.first, *last.second);
            index_.erase(last.first);
            lru_.pop_back();
        }
    }

    std::mutex mutex_;
    std::condition_variable done_;
    Lru lru_;
    std::unordered_map<std::string, Lru::iterator> index_;
    std::unordered_set<std::string> computing_;
    size_t bytes_ = 0;
    const llama_vocab * vocab_;
    const size_t budget_;
    std::once_flag tree_once_;
    std::unique_ptr<TokenTree> tree_;
    const int32_t mask_workers_;
    std::mutex pool_mutex_;
    std::unique_ptr<TaskPool> mask_pool_;
};

struct RowGrammar {
    llama_grammar * g = nullptr;        // owned
    std::shared_ptr<AllowedSets> sets;  // null: every refusal masks with `g` alone
    uint32_t id = 0;                    // the compilation's part of the key
    bool token_terminals = false;       // its rules name tokens (<[id]>): no TokenTree
    std::shared_ptr<const std::vector<uint64_t>> cuts;  // char_cuts of the compilation's rules
    // Where each rule's elements start, by address: stack entries point into this copy's
    // rules (a copy has rules of its own), so the key names them as (rule, offset).
    std::vector<std::pair<const llama_grammar_element *, uint32_t>> rule_starts;

    ~RowGrammar() { llama_grammar_free_impl(g); }

    // The key of the current state, or false when a stack entry points outside the rules
    // (never seen; that row then masks with its grammar alone).
    bool key(std::string & out) const {
        thread_local std::vector<std::string> stacks;
        stacks.resize(g->stacks.size());
        const std::less<const llama_grammar_element *> before;
        for (size_t i = 0; i < g->stacks.size(); ++i) {
            std::string & s = stacks[i];
            s.clear();
            for (const llama_grammar_element * e : g->stacks[i]) {
                auto it = std::upper_bound(rule_starts.begin(), rule_starts.end(), e,
                                           [&](const llama_grammar_element * p, const auto & r) { return before(p, r.first); });
                if (it == rule_starts.begin()) {
                    return false;
                }
                --it;
                const llama_grammar_rule & rule = g->rules[it->second];
                if (!before(e, rule.data() + rule.size())) {
                    return false;
                }
                append(s, it->second);
                append(s, static_cast<uint32_t>(e - rule.data()));
            }
        }
        // The state is the set of stacks: their order depends on the path that led there.
        std::sort(stacks.begin(), stacks.end());
        out.clear();
        append(out, id);
        append(out, g->partial_utf8.value);
        append(out, static_cast<uint32_t>(g->partial_utf8.n_remain));
        for (const std::string & s : stacks) {
            append(out, static_cast<uint32_t>(s.size()));
            out += s;
        }
        return true;
    }

private:
    static void append(std::string & s, uint32_t v) { s.append(reinterpret_cast<const char *>(&v), sizeof v); }
};

void RowGrammarDeleter::operator()(RowGrammar * g) const { delete g; }
void CompiledGrammarDeleter::operator()(llama_grammar * g) const { llama_grammar_free_impl(g); }

void set_allowed_sets_enabled(bool on) { g_sets_enabled.store(on); }
bool allowed_sets_enabled() { return g_sets_enabled.load(); }

GrammarCache::GrammarCache(const llama_vocab * vocab, int32_t mask_workers)
    : vocab_(vocab), sets_(std::make_shared<AllowedSets>(vocab, kAllowedSetsBudget, mask_workers)) {}
GrammarCache::~GrammarCache() = default;

GrammarPtr GrammarCache::make(const GenerateParams & params) {
    const std::string text = constraint_grammar(params);
    auto it = entries_.find(text);
    if (it == entries_.end()) {
        if (entries_.size() >= kMaxCompiledGrammars) {
            entries_.clear();
        }
        Entry e;
        e.id = next_id_++;
        // llama.cpp reports parse errors on stderr and returns null; it aborts on nothing here.
        if (!text.empty()) {
            e.compiled.reset(llama_grammar_init_impl(vocab_, text.c_str(), "root", false, nullptr, 0, nullptr, 0));
        }
        if (e.compiled) {
            e.token_terminals = has_token_terminals(*e.compiled);
            e.cuts = std::make_shared<const std::vector<uint64_t>>(char_cuts(*e.compiled));
        } else {
            e.error = std::string(params.grammar.empty() ? "the grammar converted from json_schema" : "grammar") +
                      " does not compile: it does not parse as GBNF, names an undefined rule, is left-recursive"
                      " or has no 'root' rule (llama.cpp's message is on stderr)";
        }
        it = entries_.emplace(text, std::move(e)).first;
    }
    if (!it->second.compiled) {
        throw Error(it->second.error);
    }
    GrammarPtr row(new RowGrammar);
    row->g = llama_grammar_clone_impl(*it->second.compiled);
    if (row->g == nullptr) {
        throw Error("could not copy a compiled grammar");
    }
    row->id = it->second.id;
    row->token_terminals = it->second.token_terminals;
    row->cuts = it->second.cuts;
    if (allowed_sets_enabled()) {
        row->sets = sets_;
        for (size_t r = 0; r < row->g->rules.size(); ++r) {
            if (!row->g->rules[r].empty()) {
                row->rule_starts.emplace_back(row->g->rules[r].data(), static_cast<uint32_t>(r));
            }
        }
        std::sort(row->rule_starts.begin(), row->rule_starts.end(), [](const auto & a, const auto & b) {
            return std::less<const llama_grammar_element *>()(a.first, b.first);
        });
    }
    return row;
}

void count(Stats & stats, ConstrainedWay way) {
    switch (way) {
        case ConstrainedWay::Kept: ++stats.n_grammar_kept; break;
        case ConstrainedWay::Top: ++stats.n_grammar_top; break;
        case ConstrainedWay::Wider: ++stats.n_grammar_wider; break;
        case ConstrainedWay::Whole: ++stats.n_grammar_whole; break;
        case ConstrainedWay::Cached: ++stats.n_grammar_cached; break;
        case ConstrainedWay::None: break;
    }
}

namespace {

// Whether `grammar` allows `token` next (one candidate through its mask).
bool allows(const llama_grammar & grammar, llama_token token) {
    llama_token_data d{token, 0.0f, 0.0f};
    llama_token_data_array a{&d, 1, -1, false};
    llama_grammar_apply_impl(grammar, &a);
    return d.logit != -INFINITY;
}

void accept_both(llama_sampler * chain, llama_grammar & grammar, llama_token token) {
    try {
        llama_grammar_accept_impl(grammar, token);
    } catch (const std::exception & e) {
        // "Unexpected empty grammar stack": the grammar has no state left to go on from.
        throw GrammarDeadEnd(std::string("the grammar failed on the chosen token: ") + e.what());
    }
    llama_sampler_accept(chain, token);
}

// Moves the allowed candidates of cur[from, to) (in order) to the front of that range;
// returns how many there are. With `set`, allowed means in it; otherwise the grammar masks.
// A candidate whose logit is -inf never counts (a mask leaves it so).
size_t mask(const llama_grammar & grammar, const Allowed * set, std::vector<llama_token_data> & cur, size_t from,
            size_t to) {
    if (set == nullptr) {
        llama_token_data_array a{cur.data() + from, to - from, -1, false};
        llama_grammar_apply_impl(grammar, &a);
    }
    size_t kept = from;
    for (size_t i = from; i < to; ++i) {
        if (cur[i].logit != -INFINITY && (set == nullptr || set->allows(cur[i].id))) {
            cur[kept++] = cur[i];
        }
    }
    return kept - from;
}

float logit_at(const LogitRow & row, size_t t) { return std::isnan(row.logits[t]) ? -INFINITY : row.logits[t]; }

// Candidates checked first when the chain keeps only the best few (greedy or top-k).
constexpr size_t kFirstChecked = 256;

}  // namespace

llama_token sample_constrained(llama_sampler * chain, RowGrammar & rg, const ChainShape & shape,
                               const LogitRow & row, std::vector<llama_token_data> & cur, ConstrainedWay & way_out) {
    way_out = ConstrainedWay::None;  // until a token is accepted
    ConstrainedWay way = ConstrainedWay::None;
    if (row.blocks != nullptr) {
        throw Error("a constrained request needs the whole row of logits");  // DeviceSampling::serves
    }
    llama_grammar & grammar = *rg.g;
    thread_local std::string key;
    const bool keyed = rg.sets && rg.key(key);
    std::shared_ptr<const Allowed> set = keyed ? rg.sets->find(key) : nullptr;
    const llama_token first = sample_logits(chain, shape, row, cur, false);
    if (set ? set->allows(first) : allows(grammar, first)) {
        accept_both(chain, grammar, first);
        way_out = ConstrainedWay::Kept;
        return first;
    }
    way = set ? ConstrainedWay::Cached : ConstrainedWay::Top;
    // The state's set, computed now (a whole mask, once for every row that comes here).
    const auto whole_set = [&]() {
        set = rg.sets->get(key, grammar, rg.token_terminals, *rg.cuts);
        way = ConstrainedWay::Whole;
    };
    // Mask, then let the chain choose among the allowed candidates.
    const auto n = static_cast<size_t>(row.n);
    size_t n_allowed = 0;
    const bool best_few = shape.keeps_best() > 0;
    const size_t need = shape.greedy ? 1 : static_cast<size_t>(std::max(shape.top_k, 1));
    const size_t head = std::max(kFirstChecked, 4 * need);
    if (!set && best_few && n > head + need) {
        // The chain keeps the `need` best allowed tokens: once that many of the best
        // candidates are allowed, the rest of the row cannot change its choice. So the
        // grammar masks the `head` best first (found without ranking the whole row); the
        // state's set is computed (when sets are on) only if too few of them pass.
        if (best_candidates(row, head, cur)) {
            n_allowed = mask(grammar, nullptr, cur, 0, cur.size());
        }
    }
    if (!set && keyed && n_allowed < need) {
        whole_set();
    }
    if (n_allowed >= need && !set) {
        // Chosen among the best candidates (ranked by best_candidates).
    } else if (set && set->n_allowed <= kListed) {
        // Few allowed tokens: the chain chooses among them alone, in token order, which is
        // what masking the whole row gives.
        cur.clear();
        for (const llama_token t : set->ids) {
            const float x = logit_at(row, static_cast<size_t>(t));
            if (x != -INFINITY) {
                cur.push_back(llama_token_data{t, x, 0.0f});
            }
        }
        n_allowed = cur.size();
    } else if (set && shape.argmax()) {
        // Greedy: the largest allowed logit, the lowest id among equals (one pass).
        llama_token best = -1;
        float best_x = -INFINITY;
        for (size_t t = 0; t < n; ++t) {
            const float x = row.logits[t];  // a NaN is never larger
            if (x > best_x && set->allows(static_cast<llama_token>(t))) {
                best_x = x;
                best = static_cast<llama_token>(t);
            }
        }
        cur.clear();
        if (best >= 0) {
            cur.push_back(llama_token_data{best, best_x, 0.0f});
        }
        n_allowed = cur.size();
    } else if (set) {
        // Every allowed token, in token order: what masking the whole row leaves.
        cur.clear();
        for (size_t t = 0; t < n; ++t) {
            const float x = logit_at(row, t);
            if (x != -INFINITY && set->allows(static_cast<llama_token>(t))) {
                cur.push_back(llama_token_data{static_cast<llama_token>(t), x, 0.0f});
            }
        }
        n_allowed = cur.size();
    } else {
        // No set (they are off, or the state has no key): the grammar masks the row.
        cur.resize(n);
        for (size_t t = 0; t < n; ++t) {
            cur[t] = llama_token_data{static_cast<llama_token>(t), logit_at(row, t), 0.0f};
        }
        n_allowed = 0;
        way = ConstrainedWay::Whole;
        if (best_few && n > head + need) {
            // In stages 16 times as large, best first, until enough pass (the first stage
            // again: it passed too few).
            size_t done = 0;
            for (size_t end_ = head; done < n && n_allowed < need; end_ *= 16) {
                const size_t end = std::min(n, end_);
                std::nth_element(cur.begin() + static_cast<std::ptrdiff_t>(done),
                                 cur.begin() + static_cast<std::ptrdiff_t>(end - 1), cur.end(), better);
                const size_t passed = mask(grammar, nullptr, cur, done, end);
                std::copy(cur.begin() + static_cast<std::ptrdiff_t>(done),
                          cur.begin() + static_cast<std::ptrdiff_t>(done + passed),
                          cur.begin() + static_cast<std::ptrdiff_t>(n_allowed));
                n_allowed += passed;
                way = end == n ? ConstrainedWay::Whole : ConstrainedWay::Wider;
                done = end;
            }
        } else {
            n_allowed = mask(grammar, nullptr, cur, 0, n);
        }
    }
    if (n_allowed == 0) {
        throw GrammarDeadEnd("the grammar allows no token here (a dead end): the output so far cannot be completed");
    }
    cur.resize(n_allowed);
    const llama_token token = apply_chain(chain, cur, false, false);
    accept_both(chain, grammar, token);
    way_out = way;
    return token;
}

GrammarCosts measure_grammar(const llama_vocab * vocab, const GenerateParams & params,
                             const std::vector<llama_token> & tokens) {
    using clock = std::chrono::steady_clock;
    const auto ms = [](clock::time_point t0) {
        return std::chrono::duration<double, std::milli>(clock::now() - t0).count();
    };
    GrammarCosts c;
    auto t0 = clock::now();
    std::string text = params.grammar;
    if (text.empty()) {
        Converted conv = convert(params.json_schema);
        if (!conv.error.empty()) {
            throw InvalidArgument(conv.error);
        }
        text = conv.grammar;
    }
    c.convert_ms = ms(t0);
    t0 = clock::now();
    SamplerPtr compiled(llama_sampler_init_grammar(vocab, text.c_str(), "root"));
    c.compile_ms = ms(t0);
    if (!compiled) {
        throw InvalidArgument("the grammar does not compile");
    }
    constexpr int kClones = 20;
    t0 = clock::now();
    for (int i = 0; i < kClones; ++i) {
        SamplerPtr copy(llama_sampler_clone(compiled.get()));
    }
    c.clone_ms = ms(t0) / kClones;
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    std::vector<llama_token_data> cur(static_cast<size_t>(n_vocab));
    // The same walk with the masks TokenTree gives (AllowedSets' whole masks).
    std::unique_ptr<llama_grammar, CompiledGrammarDeleter> walk(
        llama_grammar_init_impl(vocab, text.c_str(), "root", false, nullptr, 0, nullptr, 0));
    t0 = clock::now();
    const TokenTree tree(vocab);
    c.tree_ms = ms(t0);
    const bool token_terminals = has_token_terminals(*walk);
    const std::vector<uint64_t> cuts = char_cuts(*walk);
    std::vector<uint64_t> bits;
    for (size_t k = 0; k < tokens.size(); ++k) {
        t0 = clock::now();
        if (tree_serves(*walk, token_terminals)) {
            bits.assign((static_cast<size_t>(n_vocab) + 63) / 64, 0);
            tree.allowed(*walk, cuts, bits);
        } else {
            std::shared_ptr<const Allowed> whole = compute_allowed(*walk, nullptr, nullptr);
        }
        c.mask_tree_ms += ms(t0);
        for (int32_t t = 0; t < n_vocab; ++t) {
            cur[static_cast<size_t>(t)] = llama_token_data{t, 0.0f, 0.0f};
        }
        llama_token_data_array a{cur.data(), cur.size(), -1, false};
        t0 = clock::now();
        llama_sampler_apply(compiled.get(), &a);
        c.mask_ms += ms(t0);
        if (k == 0) {
            c.n_allowed_first = static_cast<int32_t>(
                std::count_if(cur.begin(), cur.end(), [](const llama_token_data & d) { return d.logit != -INFINITY; }));
        }
        t0 = clock::now();
        llama_token_data d{tokens[k], 0.0f, 0.0f};
        llama_token_data_array one{&d, 1, -1, false};
        llama_sampler_apply(compiled.get(), &one);
        const bool ok = d.logit != -INFINITY;
        c.check_ms += ms(t0);
        if (!ok) {
            throw InvalidArgument("the grammar does not allow token " + std::to_string(k) + " of the sequence");
        }
        llama_sampler_accept(compiled.get(), tokens[k]);
        llama_grammar_accept_impl(*walk, tokens[k]);
    }
    if (!tokens.empty()) {
        c.mask_ms /= static_cast<double>(tokens.size());
        c.mask_tree_ms /= static_cast<double>(tokens.size());
        c.check_ms /= static_cast<double>(tokens.size());
    }
    return c;
}

MaskComparison compare_masks(const llama_vocab * vocab, const GenerateParams & params, int32_t steps,
                             uint32_t seed, int32_t workers) {
    const std::string text = constraint_grammar(params);
    std::unique_ptr<llama_grammar, CompiledGrammarDeleter> g(
        llama_grammar_init_impl(vocab, text.c_str(), "root", false, nullptr, 0, nullptr, 0));
    if (!g) {
        throw InvalidArgument("the grammar does not compile");
    }
    const TokenTree tree(vocab);
    const bool token_terminals = has_token_terminals(*g);
    const std::vector<uint64_t> cuts = char_cuts(*g);
    std::unique_ptr<TaskPool> pool = workers > 0 ? std::make_unique<TaskPool>(workers) : nullptr;
    std::mt19937 rng(seed);
    MaskComparison out;
    for (int32_t step = 0; step < steps; ++step) {
        const std::shared_ptr<const Allowed> whole = compute_allowed(*g, nullptr, nullptr);
        if (tree_serves(*g, token_terminals)) {
            const std::shared_ptr<const Allowed> pruned = compute_allowed(*g, &tree, &cuts, pool.get());
            ++out.n_compared;
            if (pruned->bits != whole->bits) {
                ++out.n_differ;
            }
        }
        ++out.n_states;
        // On with a token the grammar allows, drawn at random (noise, as from a model with
        // random weights); the end of generation only when nothing else is left.
        std::vector<llama_token> next;
        for (size_t t = 0; t < whole->bits.size() * 64; ++t) {
            const auto id = static_cast<llama_token>(t);
            if (whole->allows(id) && !llama_vocab_is_eog(vocab, id)) {
                next.push_back(id);
            }
        }
        if (next.empty()) {
            break;
        }
        out.n_partial += g->partial_utf8.n_remain != 0 ? 1 : 0;
        llama_grammar_accept_impl(*g, next[rng() % next.size()]);
    }
    return out;
}

}  // namespace fastpar
