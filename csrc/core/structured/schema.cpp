#include "core/structured/schema.hpp"

#include <algorithm>
#include <cctype>
#include <mutex>
#include <set>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/base/errors.hpp"
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

// Conversions by schema or regex text, for every call and thread (the converter is stateless).
struct Converted {
    std::string grammar;
    std::string error;  // non-empty: InvalidArgument with this message
};

std::mutex g_mutex;
std::unordered_map<std::string, Converted> g_converted;
constexpr size_t kMaxConverted = 256;  // conversions kept; the cache starts over past this

// `convert(text)` once per `kind` and text: 's' a JSON schema, 'r' a regex.
Converted converted(char kind, const std::string & text, std::string (*convert)(const std::string &)) {
    const std::string key = kind + text;
    {
        std::lock_guard<std::mutex> lock(g_mutex);
        auto it = g_converted.find(key);
        if (it != g_converted.end()) {
            return it->second;
        }
    }
    Converted c;
    try {
        c.grammar = convert(text);
    } catch (const InvalidArgument & e) {
        c.error = e.what();
    }
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_converted.size() >= kMaxConverted) {
        g_converted.clear();
    }
    g_converted.emplace(key, c);
    return c;
}

Converted converted_schema(const std::string & schema) { return converted('s', schema, convert_json_schema); }
Converted converted_regex(const std::string & regex) { return converted('r', regex, regex_grammar); }

// The character classes of the shorthand escapes, in ASCII (what a class's brackets hold).
const char * shorthand_class(char c) {
    switch (c) {
        case 'd': case 'D': return "0-9";
        case 'w': case 'W': return "a-zA-Z0-9_";
        case 's': case 'S': return " \\t\\n\\r\\x0B\\x0C";
        default: return nullptr;
    }
}

[[noreturn]] void bad_regex(const std::string & regex, const std::string & why) {
    throw InvalidArgument("regex " + json(regex).dump() + ": " + why + " (docs/api.md lists the regex subset)");
}

// Rewrites what the converter does not read into what it does: the shorthand classes \d \w
// \s (and \D \W \S outside brackets) into ASCII classes, and an escaped ASCII punctuation
// character into its \xHH escape (the converter takes few escapes; \/ or \# mean the
// character itself). Other escapes pass through for the converter to read or refuse.
std::string normalize_escapes(const std::string & regex, const std::string & body) {
    static const char * const kHex = "0123456789ABCDEF";
    std::string out;
    bool in_class = false;
    for (size_t i = 0; i < body.size(); ++i) {
        const char c = body[i];
        if (c != '\\') {
            if (c == '[' && !in_class) {
                in_class = true;
            } else if (c == ']' && in_class) {
                in_class = false;
            }
            out += c;
            continue;
        }
        if (i + 1 == body.size()) {
            bad_regex(regex, "it ends with a lone backslash");
        }
        const char e = body[++i];
        if (const char * cls = shorthand_class(e)) {
            const bool negated = e >= 'A' && e <= 'Z';
            if (in_class && negated) {
                bad_regex(regex, std::string("\\") + e + " inside a character class is not supported");
            }
            out += in_class ? std::string(cls) : std::string(negated ? "[^" : "[") + cls + "]";
        } else if (e > 0x20 && e < 0x7F && !std::isalnum(static_cast<unsigned char>(e))) {
            out += "\\x";
            out += kHex[e >> 4];
            out += kHex[e & 0xF];
        } else {
            out += '\\';
            out += e;
        }
    }
    return out;
}

}  // namespace

std::string regex_grammar(const std::string & regex) {
    if (regex.empty()) {
        bad_regex(regex, "it is empty");
    }
    // The whole output matches (as re.fullmatch): anchors at the ends are implied.
    std::string body = regex;
    if (body.front() == '^') {
        body.erase(0, 1);
    }
    size_t slashes = 0;  // a final '$' is an anchor unless escaped
    while (body.size() >= 2 + slashes && body[body.size() - 2 - slashes] == '\\') {
        ++slashes;
    }
    if (!body.empty() && body.back() == '$' && slashes % 2 == 0) {
        body.pop_back();
    }
    if (body.empty()) {
        bad_regex(regex, "it matches only the empty string");
    }
    // The converter reads a JSON schema's string pattern into rules that match the string's
    // characters between its quotes; its root rule is '"\"" (RULES) "\""'.
    const json schema = {{"type", "string"}, {"pattern", "^(?:" + normalize_escapes(regex, body) + ")$"}};
    std::string text;
    try {
        text = convert_raw(schema.dump());
    } catch (const std::exception & e) {
        const std::string what = e.what();  // "...: <reason>" about the wrapped pattern
        const size_t k = what.rfind(": ");
        bad_regex(regex, "the converter cannot read it: " + (k == std::string::npos ? what : what.substr(k + 2)));
    }
    const std::string head = "root ::= \"\\\"\" (";
    const std::string tail = ") \"\\\"\"";
    // The root rule's line (the rules are written one a line, sorted by name).
    size_t at = text.compare(0, 9, "root ::= ") == 0 ? 0 : text.find("\nroot ::= ");
    if (at == std::string::npos) {
        bad_regex(regex, "the converter gave no root rule");
    }
    at += at == 0 ? 0 : 1;
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::string root = text.substr(at, end - at);
    // Anything else is the converter's "any string", what it makes of a pattern outside
    // its subset (lookarounds, backreferences, anchors inside, \b): that would not enforce it.
    if (root.size() < head.size() + tail.size() || root.compare(0, head.size(), head) != 0 ||
        root.compare(root.size() - tail.size(), tail.size(), tail) != 0) {
        bad_regex(regex, "it uses a feature outside the supported subset");
    }
    const std::string rules = root.substr(head.size(), root.size() - head.size() - tail.size());
    return text.substr(0, at) + "root ::= (" + rules + ")" + text.substr(end);
}

void validate_regex(const std::string & regex) {
    const Converted c = converted_regex(regex);
    if (!c.error.empty()) {
        throw InvalidArgument(c.error);
    }
}

void validate_json_schema(const std::string & schema) {
    const Converted c = converted_schema(schema);
    if (!c.error.empty()) {
        throw InvalidArgument(c.error);
    }
}

std::string choice_grammar(const std::vector<std::string> & choices) {
    // GBNF literals escape the quote, the backslash and control bytes; other UTF-8 stays as it is.
    static const char * const kHex = "0123456789ABCDEF";
    std::string out = "root ::=";
    for (size_t i = 0; i < choices.size(); ++i) {
        out += i == 0 ? " \"" : " | \"";
        for (const char ch : choices[i]) {
            const auto c = static_cast<unsigned char>(ch);
            if (c == '"' || c == '\\') {
                out += '\\';
                out += ch;
            } else if (c < 0x20 || c == 0x7F) {
                out += "\\x";
                out += kHex[c >> 4];
                out += kHex[c & 0xF];
            } else {
                out += ch;
            }
        }
        out += '"';
    }
    return out + "\n";
}

std::string constraint_grammar(const GenerateParams & params) {
    if (!params.grammar.empty()) {
        return params.grammar;
    }
    if (!params.choice.empty()) {
        return choice_grammar(params.choice);
    }
    Converted c = !params.regex.empty() ? converted_regex(params.regex) : converted_schema(params.json_schema);
    if (!c.error.empty()) {
        throw InvalidArgument(c.error);
    }
    return std::move(c.grammar);
}


std::string convert_json_schema(const std::string & schema) {
    try {
        json root = json::parse(schema);
        check_node(root, "#");
        return json_schema_to_grammar(common_json::parse(root.dump()));
    } catch (const InvalidArgument &) {
        throw;
    } catch (const json::exception & e) {
        throw InvalidArgument(std::string("json_schema is not valid JSON: ") + e.what());
    } catch (const std::exception & e) {
        throw InvalidArgument(std::string("json_schema could not be converted to a grammar: ") + e.what());
    }
}

}  // namespace fastpar
