"""The structured-extraction task the structured-output tests and bench/bench_structured.py
share: support tickets and a 5-field JSON schema (a string enum, a bounded integer, a
string with maxLength, a boolean, an array of strings)."""

TICKET_SCHEMA = {
    "type": "object",
    "properties": {
        "category": {"type": "string", "enum": ["bug", "feature", "question"]},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
        "summary": {"type": "string", "maxLength": 40},
        "urgent": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["category", "priority", "summary", "urgent", "tags"],
}
TICKETS = ["the app crashes when I click save", "please add a dark mode", "how do I export my data?",
           "login fails with a 500 error", "the search is slow on large folders", "can I share a board?",
           "typo on the pricing page", "support for two-factor sign-in"]
