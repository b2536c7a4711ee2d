#include "core/structured.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

#include <nlohmann/json.hpp>

#include "core/errors.hpp"
#include "json-schema-to-grammar.h"

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

SamplerPtr GrammarCache::make(const GenerateParams & params) {
    const std::string text = constraint_grammar(params);
    auto it = entries_.find(text);
    if (it == entries_.end()) {
        Entry e;
        // llama.cpp reports parse errors on stderr and returns null; it aborts on nothing here.
        e.compiled.reset(llama_sampler_init_grammar(vocab_, text.c_str(), "root"));
        if (!e.compiled) {
            e.error = std::string(params.grammar.empty() ? "the grammar converted from json_schema" : "grammar") +
                      " does not compile: it does not parse as GBNF, names an undefined rule, is left-recursive"
                      " or has no 'root' rule (llama.cpp's message is on stderr)";
        }
        it = entries_.emplace(text, std::move(e)).first;
    }
    if (!it->second.compiled) {
        throw Error(it->second.error);
    }
    SamplerPtr copy(llama_sampler_clone(it->second.compiled.get()));
    if (!copy) {
        throw Error("could not copy a compiled grammar");
    }
    return copy;
}

namespace {

// Whether `grammar` allows `token` next (one candidate through its mask).
bool allows(llama_sampler * grammar, llama_token token) {
    llama_token_data d{token, 0.0f, 0.0f};
    llama_token_data_array a{&d, 1, -1, false};
    llama_sampler_apply(grammar, &a);
    return d.logit != -INFINITY;
}

void accept_both(llama_sampler * chain, llama_sampler * grammar, llama_token token) {
    try {
        llama_sampler_accept(grammar, token);
    } catch (const std::exception & e) {
        // "Unexpected empty grammar stack": the grammar has no state left to go on from.
        throw GrammarDeadEnd(std::string("the grammar failed on the chosen token: ") + e.what());
    }
    llama_sampler_accept(chain, token);
}

// Masks cur[from, to) with the grammar and moves the allowed candidates (in order) to the
// front of that range; returns how many there are.
size_t mask(llama_sampler * grammar, std::vector<llama_token_data> & cur, size_t from, size_t to) {
    llama_token_data_array a{cur.data() + from, to - from, -1, false};
    llama_sampler_apply(grammar, &a);
    size_t kept = from;
    for (size_t i = from; i < to; ++i) {
        if (cur[i].logit != -INFINITY) {
            cur[kept++] = cur[i];
        }
    }
    return kept - from;
}

bool better(const llama_token_data & a, const llama_token_data & b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// Candidates checked first when the chain keeps only the best few (greedy or top-k).
constexpr size_t kFirstChecked = 256;

}  // namespace

llama_token sample_constrained(llama_sampler * chain, llama_sampler * grammar, const GenerateParams & p,
                               const LogitRow & row, std::vector<llama_token_data> & cur) {
    if (row.blocks != nullptr) {
        throw Error("a constrained request needs the whole row of logits");  // LogitReducer::serves
    }
    const llama_token first = sample_logits(chain, p, row, cur, false);
    if (allows(grammar, first)) {
        accept_both(chain, grammar, first);
        return first;
    }
    // Mask, then let the chain choose among the allowed candidates.
    const auto n = static_cast<size_t>(row.n);
    cur.resize(n);
    for (size_t t = 0; t < n; ++t) {
        cur[t] = llama_token_data{static_cast<llama_token>(t), std::isnan(row.logits[t]) ? -INFINITY : row.logits[t], 0.0f};
    }
    size_t n_allowed = 0;
    const bool best_few = !has_penalties(p) && (p.temperature <= 0.0f || p.top_k > 0);
    const size_t need = p.temperature <= 0.0f ? 1 : static_cast<size_t>(std::max(p.top_k, 1));
    if (best_few && n > kFirstChecked + need) {
        // The chain keeps the `need` best allowed tokens: once that many of the best
        // candidates are allowed, the rest of the row cannot change its choice. So the
        // best ones are checked first, in stages 16 times as large, until enough pass.
        size_t done = 0;
        for (size_t head = std::max(kFirstChecked, 4 * need); done < n && n_allowed < need; head *= 16) {
            const size_t end = std::min(n, head);
            std::nth_element(cur.begin() + static_cast<std::ptrdiff_t>(done),
                             cur.begin() + static_cast<std::ptrdiff_t>(end - 1), cur.end(), better);
            const size_t passed = mask(grammar, cur, done, end);
            std::copy(cur.begin() + static_cast<std::ptrdiff_t>(done),
                      cur.begin() + static_cast<std::ptrdiff_t>(done + passed),
                      cur.begin() + static_cast<std::ptrdiff_t>(n_allowed));
            n_allowed += passed;
            done = end;
        }
    } else {
        n_allowed = mask(grammar, cur, 0, n);
    }
    if (n_allowed == 0) {
        throw GrammarDeadEnd("the grammar allows no token here (a dead end): the output so far cannot be completed");
    }
    cur.resize(n_allowed);
    llama_token_data_array a{cur.data(), cur.size(), -1, false};
    llama_sampler_apply(chain, &a);
    if (a.selected < 0 || a.selected >= static_cast<int64_t>(a.size)) {
        throw Error("the sampler chain selected no token");
    }
    const llama_token token = a.data[a.selected].id;
    accept_both(chain, grammar, token);
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
    for (size_t k = 0; k < tokens.size(); ++k) {
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
        const bool ok = allows(compiled.get(), tokens[k]);
        c.check_ms += ms(t0);
        if (!ok) {
            throw InvalidArgument("the grammar does not allow token " + std::to_string(k) + " of the sequence");
        }
        llama_sampler_accept(compiled.get(), tokens[k]);
    }
    if (!tokens.empty()) {
        c.mask_ms /= static_cast<double>(tokens.size());
        c.check_ms /= static_cast<double>(tokens.size());
    }
    return c;
}

}  // namespace fastpar
