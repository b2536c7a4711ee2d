#include "core/structured/schema.hpp"

#include <algorithm>
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
        c.grammar = convert_json_schema(schema);
    } catch (const InvalidArgument & e) {
        c.error = e.what();
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
    Converted c = converted(params.json_schema);
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
