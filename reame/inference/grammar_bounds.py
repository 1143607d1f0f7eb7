"""What a grammar may cost before llama.cpp is handed it, and what a JSON schema may cost before
it is turned into one.

llama.cpp parses a grammar (GBNF) by recursion, one level per nested group, and starts it by
recursion, one level per rule reached at an alternative's start; too deep a grammar overflows
the thread's stack and the process dies (a schema `"pattern": "^a{0,28565}$"` becomes 28,565
nested groups). llama-cpp-python's schema converter writes a repetition out in full, copy by
copy, and nests an optional one: `{"minItems": 10**8}` or `"pattern": "^a{10**8}$"` builds
gigabytes of text before any size check could look at it. So a grammar's depth and size are
reckoned from its text, and a schema's from its numbers and patterns, first.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

# llama.cpp expands a repetition x{m,n} into n copies of x, and every token's sampling walks
# the grammar's rules, so a schema of maxLength 10**6 costs memory and minutes per token.
MAX_GRAMMAR_CHARS = 200_000
MAX_GRAMMAR_REPEAT = 1_000
# Nested groups plus rules reached at a start, one within another: 2,000 levels cost
# llama.cpp under 2 MB of stack (a thread has 8 MB) and its start about 10 ms.
MAX_GRAMMAR_DEPTH = 2_000
_REPEAT = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")
_TOKEN = re.compile(r'''\s+|#[^\n]*|"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|::=|[A-Za-z0-9_-]+'''
                    r'''|\{[^}]*\}|[\s\S]''')
_NAME = re.compile(r"[A-Za-z0-9_-]+")


class GrammarError(ValueError):
    """A grammar llama.cpp cannot follow, or one past the bounds."""


def check_grammar_bounds(grammar: str) -> None:
    """GrammarError when the grammar is over the bounds of size, repetition or depth."""
    repeats = (int(n) for pair in _REPEAT.findall(grammar) for n in pair if n)
    if len(grammar) > MAX_GRAMMAR_CHARS or max(repeats, default=0) > MAX_GRAMMAR_REPEAT:
        raise GrammarError(f"it is over {MAX_GRAMMAR_CHARS:,} characters of grammar or "
                           f"repeats a part over {MAX_GRAMMAR_REPEAT:,} times")
    if grammar_depth(grammar) > MAX_GRAMMAR_DEPTH:
        raise GrammarError(f"it nests over {MAX_GRAMMAR_DEPTH:,} levels deep")


def grammar_depth(grammar: str) -> int:
    """An upper bound of how deep llama.cpp recurses over the grammar: its deepest nesting of
    groups plus its longest chain of rules each reached at the start of the one before (an
    alternative's first element, or one after a part that may be empty). A chain that comes
    back to where it started (left recursion, which llama.cpp refuses) counts as too deep."""
    tokens = [t for t in _TOKEN.findall(grammar) if not t.isspace() and not t.startswith("#")]
    corners: dict[str, set[str]] = {}
    nesting = 0
    for rule, body in _rules(tokens):
        found, deepest = _left_corners(body)
        corners.setdefault(rule, set()).update(found)
        nesting = max(nesting, deepest)
    return nesting + _longest_chain(corners)


def _rules(tokens: list[str]) -> Iterator[tuple[str, list[str]]]:
    starts = [i for i in range(len(tokens) - 1)
              if tokens[i + 1] == "::=" and _NAME.fullmatch(tokens[i])]
    for n, at in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(tokens)
        yield tokens[at], tokens[at + 2:end]


def _left_corners(body: list[str]) -> tuple[set[str], int]:
    """The rules a body may reach before any character, and its deepest nesting of groups."""
    found: set[str] = set()
    opened: list[bool] = []  # for each open group: whether it began at the start
    at_start, before, deepest = True, True, 0
    for token in body:
        if token == "(":
            opened.append(at_start)
            deepest = max(deepest, len(opened))
        elif token == ")":
            before = opened.pop() if opened else False
            at_start = False
        elif token == "|":
            at_start = opened[-1] if opened else True
        elif token in ("?", "*") or (token.startswith("{") and _may_be_none(token)):
            at_start = before or at_start  # the part before may be empty
        elif token == "+" or token.startswith("{"):
            pass
        elif _NAME.fullmatch(token):
            if at_start:
                found.add(token)
            before, at_start = at_start, False
        elif token == '""':
            before = at_start  # empty: what follows is where this was
        else:
            before, at_start = at_start, False
    return found, deepest


def _may_be_none(token: str) -> bool:
    found = _REPEAT.fullmatch(token)
    return bool(found) and int(found.group(1)) == 0


def _longest_chain(corners: dict[str, set[str]]) -> int:
    """The longest path through corners (rule -> rules at its start), without recursion."""
    longest: dict[str, int] = {}
    for root in corners:
        if root in longest:
            continue
        path, stack = {root}, [(root, iter(sorted(corners.get(root, ()))))]
        while stack:
            rule, nexts = stack[-1]
            step = next(nexts, None)
            if step is None:
                stack.pop()
                path.discard(rule)
                longest[rule] = 1 + max((longest.get(n, 0) for n in corners.get(rule, ())),
                                        default=0)
            elif step in path:
                return MAX_GRAMMAR_DEPTH + 1  # left recursion
            elif step not in longest and step in corners:
                path.add(step)
                stack.append((step, iter(sorted(corners[step]))))
    return max(longest.values(), default=0)


# What one copy of a schema's or a pattern's part costs in the converter's grammar, in
# characters: a repetition of n is n copies, nested `(x (x ...)?)?`.
_COPY_CHARS = 8
_COUNTS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties")


def check_schema_cost(schema: object) -> None:
    """GrammarError when the grammar llama-cpp-python's converter would write for this JSON
    schema is over the bounds, reckoned from the schema's counts and patterns without
    converting it (the converter writes each repetition out in full)."""
    chars, stack = 0, [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            if key in _COUNTS and isinstance(value, int) and not isinstance(value, bool):
                if value > MAX_GRAMMAR_REPEAT:
                    raise GrammarError(f"'{key}' is {value:,}: at most "
                                       f"{MAX_GRAMMAR_REPEAT:,} can be followed")
                chars += value * _COPY_CHARS
            elif key == "pattern" and isinstance(value, str):
                chars += pattern_cost(value)
            elif isinstance(value, (dict, list)):
                stack.append(value)
        if chars > MAX_GRAMMAR_CHARS:
            raise GrammarError(f"it would be over {MAX_GRAMMAR_CHARS:,} characters of grammar")


def pattern_cost(pattern: str) -> int:
    """About how many characters of grammar a regular expression becomes (each repetition
    written out), from Python's own parse of it; GrammarError for a repetition over
    MAX_GRAMMAR_REPEAT. A pattern Python cannot parse is reckoned from its numbers alone."""
    import re._constants as c
    import re._parser as parser

    def cost(part) -> int:
        total = 0
        for op, value in part:
            if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
                low, high, item = value
                copies = low + 1 if high is c.MAXREPEAT else high
                if copies > MAX_GRAMMAR_REPEAT:
                    raise GrammarError(f"the pattern repeats a part {copies:,} times: at "
                                       f"most {MAX_GRAMMAR_REPEAT:,} can be followed")
                total += max(copies, 1) * cost(item)
            elif op is c.SUBPATTERN:
                total += cost(value[-1])
            elif op is c.BRANCH:
                total += sum(cost(branch) for branch in value[1])
            elif op in (c.ASSERT, c.ASSERT_NOT):
                total += cost(value[1])
            else:
                total += _COPY_CHARS
            if total > MAX_GRAMMAR_CHARS:
                raise GrammarError(f"the pattern would be over {MAX_GRAMMAR_CHARS:,} "
                                   "characters of grammar")
        return total

    try:
        tree = parser.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError):
        counts = [int(n) for pair in _REPEAT.findall(pattern) for n in pair if n]
        if max(counts, default=0) > MAX_GRAMMAR_REPEAT:
            raise GrammarError(f"the pattern repeats a part over {MAX_GRAMMAR_REPEAT:,} "
                               "times") from None
        total = len(pattern) * _COPY_CHARS
        for n in counts:
            total *= max(n, 1)
            if total > MAX_GRAMMAR_CHARS:
                raise GrammarError(f"the pattern would be over {MAX_GRAMMAR_CHARS:,} "
                                   "characters of grammar") from None
        return total
    try:
        return cost(tree)
    except RecursionError:
        raise GrammarError("the pattern nests its groups too deep") from None
