"""The questions: short facts of the Python language reference, each checked against its section.

Every answer is a short string written in the reference (an exception or method name, a
keyword, a number, a PEP), and every question names a gold ``section_id`` and an ``evidence``
phrase: words copied from that section (compared with whitespace collapsed, since the text is
wrapped at 70 columns) that contain the answer. ``tests/test_dataset.py`` checks both for every
question. ``aliases`` are other spellings an exact match accepts (``PEP 3104`` → ``3104``).

Every fifth question (index 4, 9, ...) is in the ``eval`` split, the rest in ``train``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SPLITS = ("train", "eval", "all")


@dataclass(frozen=True)
class Question:
    question: str
    answer: str
    section_id: str
    evidence: str
    aliases: tuple[str, ...] = ()

    def row(self) -> dict[str, Any]:
        """The dataset row: ``question``, ``answer`` and ``info`` (gold section, evidence, aliases)."""
        info = {"section_id": self.section_id, "evidence": self.evidence, "aliases": list(self.aliases)}
        return {"question": self.question, "answer": self.answer, "info": info}


Q = Question
QUESTIONS: tuple[Question, ...] = (
    Q(
        "Which exception does a failing assert statement raise?",
        "AssertionError",
        "assert:the-assert-statement",
        "if not expression: raise AssertionError",
    ),
    Q(
        "Which built-in variable is False when optimization is requested with -O, so that assert statements do nothing?",
        "__debug__",
        "assert:the-assert-statement",
        'the built-in variable "__debug__" is "True" under normal circumstances',
    ),
    Q(
        "Which exception is raised when a del statement deletes a name that is unbound?",
        "NameError",
        "del:the-del-statement",
        'If the name is unbound, a "NameError" exception will be raised',
    ),
    Q(
        "In a generator function, which exception does a return statement cause to be raised?",
        "StopIteration",
        "return:the-return-statement",
        'the "return" statement indicates that the generator is done and will cause "StopIteration" to be raised',
    ),
    Q(
        "Which exception does an empty return statement in an asynchronous generator cause to be raised?",
        "StopAsyncIteration",
        "return:the-return-statement",
        'will cause "StopAsyncIteration" to be raised',
    ),
    Q(
        "Which statement makes the listed identifiers refer to previously bound variables in the nearest enclosing scope, excluding globals?",
        "nonlocal",
        "nonlocal:the-nonlocal-statement",
        'The "nonlocal" statement causes the listed identifiers to refer to previously bound variables in the nearest enclosing scope excluding globals',
    ),
    Q(
        "Which PEP is the specification of the nonlocal statement?",
        "PEP 3104",
        "nonlocal:the-nonlocal-statement",
        "**PEP 3104** - Access to Names in Outer Scopes",
        ("3104",),
    ),
    Q(
        "What does the expression -1**2 evaluate to in Python?",
        "-1",
        "power:the-power-operator",
        '"-1**2" results in "-1"',
    ),
    Q("What does 10**-2 return?", "0.01", "power:the-power-operator", '"10**-2" returns "0.01"'),
    Q(
        "Which exception is raised when 0.0 is raised to a negative power?",
        "ZeroDivisionError",
        "power:the-power-operator",
        'Raising "0.0" to a negative power results in a "ZeroDivisionError"',
    ),
    Q(
        "Which special method customizes the power operator?",
        "__pow__",
        "power:the-power-operator",
        'This operation can be customized using the special "__pow__()" method',
    ),
    Q(
        "Which special method can a custom object override to support the unary ~ (invert) operator?",
        "__invert__",
        "unary:unary-arithmetic-and-bitwise-operations",
        'override the "__invert__()" special method',
    ),
    Q(
        "How is the bitwise inversion of x defined, as an expression?",
        "-(x+1)",
        "unary:unary-arithmetic-and-bitwise-operations",
        'The bitwise inversion of "x" is defined as "-(x+1)"',
    ),
    Q(
        "Which built-in value should numeric and rich comparison methods return when they do not implement the operation for the operands provided?",
        "NotImplemented",
        "types:notimplemented",
        'accessed through the built-in name "NotImplemented". Numeric methods and rich comparison methods should return this value',
    ),
    Q(
        "Which warning does evaluating NotImplemented in a boolean context emit since Python 3.9?",
        "DeprecationWarning",
        "types:notimplemented",
        'it will emit a "DeprecationWarning"',
    ),
    Q(
        "Besides the name Ellipsis, how else is the ellipsis object written?",
        "...",
        "bltin-ellipsis-object:the-ellipsis-object",
        'It is written as "Ellipsis" or "..."',
    ),
    Q(
        "Which special method is called when an instance is called as a function?",
        "__call__",
        "callable-types:emulating-callable-objects",
        'Called when the instance is “called” as a function; if this method is defined, "x(arg1, arg2, ...)" roughly translates to "type(x).__call__(x, arg1, ...)"',
    ),
    Q(
        "Which context manager method does the with statement call to enter the runtime context, binding its return value to the as target?",
        "__enter__",
        "context-managers:with-statement-context-managers",
        "object.__enter__(self) Enter the runtime context related to this object",
    ),
    Q(
        "Which PEP is the specification of the with statement?",
        "PEP 343",
        "context-managers:with-statement-context-managers",
        "**PEP 343** - The “with” statement",
        ("343",),
    ),
    Q(
        "Which is the only feature that still requires using a future statement?",
        "annotations",
        "import:future-statements-part-1",
        'The only feature that requires using the future statement is "annotations"',
    ),
    Q(
        "For which exception does the interpreter not print a stack traceback when it is not handled?",
        "SystemExit",
        "exceptions:exceptions",
        'it prints a stack traceback, except when the exception is "SystemExit"',
    ),
    Q(
        "Which built-in function determines an object's identity?",
        "id()",
        "comparisons:identity-comparisons",
        'An Object’s identity is determined using the "id()" function',
        ("id",),
    ),
    Q(
        "In which Python version were soft keywords such as match and case added?",
        "3.10",
        "identifiers:soft-keywords",
        "New in version 3.10.",
    ),
    Q(
        "What is the real part of the complex number that an imaginary literal yields?",
        "0.0",
        "imaginary:imaginary-literals",
        "An imaginary literal yields a complex number with a real part of 0.0",
    ),
    Q(
        "Which special method is called to create a new instance of a class, before __init__ customizes it?",
        "__new__",
        "customization:basic-customization-part-1",
        "object.__new__(cls[, ...]) Called to create a new instance of class *cls*",
    ),
    Q(
        "Which exception is raised at runtime when __init__ returns a value other than None?",
        "TypeError",
        "customization:basic-customization-part-1",
        'no non-"None" value may be returned by "__init__()"; doing so will cause a "TypeError" to be raised at runtime',
    ),
    Q(
        "Which special method does the repr() built-in function call to compute the official string representation of an object?",
        "__repr__",
        "customization:basic-customization-part-2",
        'object.__repr__(self) Called by the "repr()" built-in function',
    ),
    Q(
        "A class that overrides __eq__ without defining __hash__ gets its __hash__ implicitly set to what?",
        "None",
        "customization:basic-customization-part-5",
        'will have its "__hash__()" implicitly set to "None"',
    ),
    Q(
        "In which Python version was hash randomization enabled by default?",
        "3.3",
        "customization:basic-customization-part-5",
        "Changed in version 3.3: Hash randomization is enabled by default.",
    ),
    Q(
        "Which special method implements truth value testing and the built-in operation bool()?",
        "__bool__",
        "customization:basic-customization-part-5",
        'object.__bool__(self) Called to implement truth value testing and the built-in operation "bool()"',
    ),
    Q(
        "Which rich comparison method is the reflection of __lt__?",
        "__gt__",
        "customization:basic-customization-part-4",
        '"__lt__()" and "__gt__()" are each other’s reflection',
    ),
    Q(
        "Which function from functools generates all ordering operations from a single root operation?",
        "functools.total_ordering()",
        "customization:basic-customization-part-3",
        'To automatically generate ordering operations from a single root operation, see "functools.total_ordering()"',
        ("total_ordering", "functools.total_ordering"),
    ),
    Q(
        "Which special method is called when the default attribute access fails with an AttributeError?",
        "__getattr__",
        "attribute-access:customizing-attribute-access-part-1",
        'object.__getattr__(self, name) Called when the default attribute access fails with an "AttributeError"',
    ),
    Q(
        "Without a __dict__, which exception is raised when assigning to a variable name not listed in __slots__?",
        "AttributeError",
        "attribute-access:__slots__-part-1",
        'Attempts to assign to an unlisted variable name raises "AttributeError"',
    ),
    Q(
        "Which special method do dict subclasses define to handle a key that is not in the dictionary?",
        "__missing__",
        "sequence-types:emulating-container-types-part-2",
        'object.__missing__(self, key) Called by "dict"."__getitem__()" to implement "self[key]" for dict subclasses when key is not in the dictionary',
    ),
    Q(
        "Which special method implements operator.length_hint()?",
        "__length_hint__",
        "sequence-types:emulating-container-types-part-1",
        'object.__length_hint__(self) Called to implement "operator.length_hint()"',
    ),
    Q(
        "Which exception should __getitem__ raise for a key that is missing from a mapping?",
        "KeyError",
        "sequence-types:emulating-container-types-part-2",
        'if *key* is missing (not in the container), "KeyError" should be raised',
    ),
    Q(
        "Which special method does the reversed() built-in call to implement reverse iteration?",
        "__reversed__",
        "sequence-types:emulating-container-types-part-2",
        'object.__reversed__(self) Called (if present) by the "reversed()" built-in to implement reverse iteration',
    ),
    Q(
        "In CPython, the length returned by __len__ is required to be at most what?",
        "sys.maxsize",
        "sequence-types:emulating-container-types-part-1",
        'In CPython, the length is required to be at most "sys.maxsize"',
    ),
    Q(
        "Which special method is called whenever Python needs to losslessly convert a numeric object to an integer, for example in slicing or bin()?",
        "__index__",
        "numeric-types:emulating-numeric-types-part-2",
        'object.__index__(self) Called to implement "operator.index()", and whenever Python needs to losslessly convert the numeric object to an integer object',
    ),
    Q(
        "Which special method implements the built-in function round()?",
        "__round__",
        "numeric-types:emulating-numeric-types-part-2",
        'object.__round__(self[, ndigits]) object.__trunc__(self) object.__floor__(self) object.__ceil__(self) Called to implement the built-in function "round()"',
    ),
    Q(
        "Which exception does range() raise when its step argument is zero?",
        "ValueError",
        "typesseq:ranges-part-1",
        'If *step* is zero, "ValueError" is raised',
    ),
    Q(
        "If the step argument of range() is omitted, what does it default to?",
        "1",
        "typesseq:ranges-part-1",
        'If the *step* argument is omitted, it defaults to "1"',
    ),
    Q(
        "Which utility converts a 2.x style cmp function to a key function for list.sort()?",
        "functools.cmp_to_key()",
        "typesseq:lists-part-1",
        'The "functools.cmp_to_key()" utility is available to convert a 2.x style *cmp* function to a *key* function',
        ("cmp_to_key", "functools.cmp_to_key"),
    ),
    Q(
        "The list sort() method is guaranteed to be what, so that elements that compare equal keep their relative order?",
        "stable",
        "typesseq:lists-part-1",
        'The "sort()" method is guaranteed to be stable',
    ),
    Q(
        "What is the source character encoding when a source file has no encoding declaration?",
        "UTF-8",
        "strings:string-and-bytes-literals-part-1",
        "it is UTF-8 if no encoding declaration is given in the source file",
    ),
    Q(
        "Bytes with a numeric value of how much or greater must be expressed with escapes in a bytes literal?",
        "128",
        "strings:string-and-bytes-literals-part-1",
        "bytes with a numeric value of 128 or greater must be expressed with escapes",
    ),
    Q(
        "Which PEP reintroduced the u'value' unicode legacy literal?",
        "PEP 414",
        "strings:string-and-bytes-literals-part-1",
        "See **PEP 414** for more information",
        ("414",),
    ),
    Q(
        "Which PEP added class decorators?",
        "PEP 3129",
        "class:class-definitions",
        "**PEP 3129** - Class Decorators",
        ("3129",),
    ),
    Q(
        "Which exception is raised when a function uses a local variable that has not yet been bound to a value?",
        "UnboundLocalError",
        "execmodel:resolution-of-names-part-1",
        'the name refers to a local variable that has not yet been bound to a value at the point where the name is used, an "UnboundLocalError" exception is raised',
    ),
    Q(
        "What is the main module for a script always called?",
        "__main__",
        "execmodel:resolution-of-names-part-1",
        'The main module for a script is always called "__main__"',
    ),
    Q(
        "In which attribute of a function object are its parameter annotations available?",
        "__annotations__",
        "function:function-definitions-part-2",
        'The annotation values are available as values of a dictionary keyed by the parameters’ names in the "__annotations__" attribute of the function object',
    ),
    Q(
        "Which PEP introduced the / syntax for positional-only parameters?",
        "PEP 570",
        "function:function-definitions-part-2",
        "See **PEP 570** for details",
        ("570",),
    ),
    Q(
        "Which exception does a bare raise statement raise when there is no active exception?",
        "RuntimeError",
        "raise:the-raise-statement-part-1",
        'If there isn’t currently an active exception, a "RuntimeError" exception is raised',
    ),
    Q(
        "With raise ... from, as which attribute is the second exception attached to the raised exception?",
        "__cause__",
        "raise:the-raise-statement-part-1",
        'it will be attached to the raised exception as the "__cause__" attribute',
    ),
    Q(
        "Which PEP is the specification of structural pattern matching?",
        "PEP 634",
        "compound:the-match-statement",
        "**PEP 634** – Structural Pattern Matching: Specification",
        ("634",),
    ),
    Q(
        "Before which Python version was a continue statement illegal in a finally clause?",
        "3.8",
        "compound:finally-clause",
        'Prior to Python 3.8, a "continue" statement was illegal in the "finally" clause',
    ),
    Q(
        "Which exception is raised at compile time if a name given in a nonlocal statement does not exist in any enclosing function scope?",
        "SyntaxError",
        "execmodel:resolution-of-names-part-1",
        '"SyntaxError" is raised at compile time if the given name does not exist in any enclosing function scope',
    ),
)


def rows(split: str = "all") -> list[dict[str, Any]]:
    """The dataset rows of ``split``: ``train`` (4 in 5), ``eval`` (every fifth) or ``all``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
    chosen = [q for i, q in enumerate(QUESTIONS) if split == "all" or (i % 5 == 4) == (split == "eval")]
    return [q.row() for q in chosen]
