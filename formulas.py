"""Chemical formulas: element symbols, a formula's tokens and its composition, for the composition studies
(the tutorial's experiment 7: formation energy from a formula) and the saved materials predictor.

    ELEMENTS, FRACTION_ELEMENTS   the 118 element symbols; the 89 of an element-fraction vector
    tokenize_formula              "Mg2Si" -> ["Mg", "2", "Si"] (brackets and decimal amounts kept)
    parse_formula                 the composition {element: amount}, brackets multiplied out, exact
    reduced_formula, formula_explicit
                                  one spelling per composition; every amount written ("Mg2Si1")
    element_fractions             the composition as fractions over FRACTION_ELEMENTS
    abbreviated                   a long input quoted for an error message (its head and its length)

Standard library only; it imports no other module of the project (``chemdata`` imports it).
"""
import math
import re
from fractions import Fraction

__all__ = ["ELEMENTS", "FRACTION_ELEMENTS", "ELEMENT_AMOUNT", "SIMPLE_FORMULA", "MAX_AMOUNT_CHARS", "tokenize_formula",
           "parse_formula", "reduced_formula", "formula_explicit", "element_fractions", "abbreviated"]


def abbreviated(text, limit=80):
    """``text`` quoted for an error message: whole when it is short, else its first ``limit`` characters and
    its length (an input of a megabyte is not echoed back whole)."""
    text = str(text)
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text):,} characters)"


ELEMENTS = (
    "H", "He", "Li", "Be", "B", "C", "N", "O", "F", "Ne",
    "Na", "Mg", "Al", "Si", "P", "S", "Cl", "Ar", "K", "Ca",
    "Sc", "Ti", "V", "Cr", "Mn", "Fe", "Co", "Ni", "Cu", "Zn",
    "Ga", "Ge", "As", "Se", "Br", "Kr", "Rb", "Sr", "Y", "Zr",
    "Nb", "Mo", "Tc", "Ru", "Rh", "Pd", "Ag", "Cd", "In", "Sn",
    "Sb", "Te", "I", "Xe", "Cs", "Ba", "La", "Ce", "Pr", "Nd",
    "Pm", "Sm", "Eu", "Gd", "Tb", "Dy", "Ho", "Er", "Tm", "Yb",
    "Lu", "Hf", "Ta", "W", "Re", "Os", "Ir", "Pt", "Au", "Hg",
    "Tl", "Pb", "Bi", "Po", "At", "Rn", "Fr", "Ra", "Ac", "Th",
    "Pa", "U", "Np", "Pu", "Am", "Cm", "Bk", "Cf", "Es", "Fm",
    "Md", "No", "Lr", "Rf", "Db", "Sg", "Bh", "Hs", "Mt", "Ds",
    "Rg", "Cn", "Nh", "Fl", "Mc", "Lv", "Ts", "Og")
"""All 118 element symbols in periodic-table order (``ELEMENTS[z - 1]``)."""

FRACTION_ELEMENTS = ELEMENTS[:83] + ("Ac", "Th", "Pa", "U", "Np", "Pu")
"""The 89 elements of ``element_fractions`` vectors, in periodic-table order:
H to Bi (Z = 1..83) plus the actinides Ac, Th, Pa, U, Np, Pu that occur in
``mp_e_form.csv``.  The data use 84 of them (no noble gases, no Po/At/Rn/Fr/Ra)."""

_ELEMENT_SET = frozenset(ELEMENTS)
_FORMULA_TOKEN = re.compile(r"[A-Z][a-z]?|[0-9]+(?:\.[0-9]+)?|\.[0-9]+|[()\[\]]")
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?|\.[0-9]+")
ELEMENT_AMOUNT = re.compile(r"([A-Z][a-z]?)([0-9]+(?:\.[0-9]+)?|\.[0-9]+)?")
"""One element symbol and its amount as written ("Ca1" -> ("Ca", "1"); "O" -> ("O", ""))."""
SIMPLE_FORMULA = re.compile(r"(?:[A-Z][a-z]?(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)?)+")
"""A formula without brackets: element-amount pairs only ("Ca1F6Ti1")."""


def tokenize_formula(formula):
    """Split a chemical formula into element symbols, amounts and brackets.

    Amounts are whole numbers such as ``"12"`` or ``"0.5"``.  An unknown
    element symbol or a character that fits no token raises ValueError.

    >>> tokenize_formula("Mg2Si")
    ['Mg', '2', 'Si']
    """
    tokens = _FORMULA_TOKEN.findall(formula)
    if "".join(tokens) != formula:
        position = 0
        while True:   # find the first character no token starts at
            match = _FORMULA_TOKEN.match(formula, position)
            if match is None:
                break
            position = match.end()
        raise ValueError(f"cannot tokenize character {formula[position]!r} at position "
                         f"{position} of formula {abbreviated(formula)}")
    for token in tokens:
        if token[0].isalpha() and token not in _ELEMENT_SET:
            raise ValueError(f"unknown element symbol {token!r} in formula {abbreviated(formula)}")
    return tokens


MAX_AMOUNT_CHARS = 50
"""A formula's amounts are at most this many characters long ('1000000', '0.125'): a longer one is refused with
its length (a 100,000-digit amount met Python's limit on int conversion, 4,300 digits, in a message about
sys.set_int_max_str_digits)."""


def _parse_formula_exact(formula):
    """Parse a formula into {element: int or Fraction}, in order of first appearance."""
    long = next((m.group() for m in _NUMBER.finditer(formula) if len(m.group()) > MAX_AMOUNT_CHARS), None)
    if long is not None:
        raise ValueError(f"an amount of {len(long):,} characters in formula {abbreviated(formula)}: amounts are "
                         f"at most {MAX_AMOUNT_CHARS} characters")
    if SIMPLE_FORMULA.fullmatch(formula):       # fast path: no brackets, e.g. Ca1F6Ti1
        composition = {}
        for element, text in ELEMENT_AMOUNT.findall(formula):
            if element not in _ELEMENT_SET:
                raise ValueError(f"unknown element symbol {element!r} in formula {abbreviated(formula)}")
            amount = 1 if not text else int(text) if text.isdigit() else Fraction(text)
            if amount <= 0:
                raise ValueError(f"amount {text!r} in formula {abbreviated(formula)} is not positive")
            composition[element] = composition.get(element, 0) + amount
        return composition
    tokens = tokenize_formula(formula)
    if not tokens:
        raise ValueError(f"empty formula {abbreviated(formula)}")
    stack = [{}]            # one composition per open bracket
    opened = []             # the bracket characters still open
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token in ("(", "["):
            stack.append({})
            opened.append(token)
            continue
        if _NUMBER.fullmatch(token):
            raise ValueError(f"amount {token!r} in formula {abbreviated(formula)} does not follow "
                             f"an element or a closing bracket")
        amount = 1
        if i < len(tokens) and _NUMBER.fullmatch(tokens[i]):
            text = tokens[i]
            amount = int(text) if text.isdigit() else Fraction(text)   # exact, no rounding
            if amount <= 0:
                raise ValueError(f"amount {tokens[i]!r} in formula {abbreviated(formula)} is not positive")
            i += 1
        if token in (")", "]"):
            if not opened or opened.pop() + token not in ("()", "[]"):
                raise ValueError(f"unbalanced {token!r} in formula {abbreviated(formula)}")
            group = stack.pop()
            for element, count in group.items():
                stack[-1][element] = stack[-1].get(element, 0) + count * amount
        else:
            stack[-1][token] = stack[-1].get(token, 0) + amount
    if opened:
        raise ValueError(f"unclosed {opened[-1]!r} in formula {abbreviated(formula)}")
    return stack[0]


def parse_formula(formula):
    """Parse a formula into ``{element: amount}`` (floats, order of first appearance).

    Accepts explicit ones (``C1Pt1``), decimals (``Fe0.5Ni0.5``) and nested
    brackets (``Ca3(PO4)2``); repeated elements are added up.  Unknown
    element symbols, unbalanced brackets and zero amounts raise ValueError.

    >>> parse_formula("Ca3(PO4)2")
    {'Ca': 3.0, 'P': 2.0, 'O': 8.0}
    """
    return {element: float(amount) for element, amount in _parse_formula_exact(formula).items()}


def reduced_formula(formula):
    """The reduced formula in a fixed order: elements sorted alphabetically,
    amounts divided by their greatest common divisor, amounts of 1 omitted.

    Decimal amounts are made whole first, exactly: ``Fe0.5Ni0.5`` -> ``FeNi``,
    ``Ca1F6Ti1`` and ``Ca2F12Ti2`` -> ``CaF6Ti``.
    """
    composition = _parse_formula_exact(formula)
    if not all(isinstance(amount, int) for amount in composition.values()):
        scale = math.lcm(*(amount.denominator for amount in composition.values()))
        composition = {element: int(amount * scale) for element, amount in composition.items()}
    divisor = math.gcd(*composition.values())
    parts = []
    for element in sorted(composition):
        count = composition[element] // divisor
        parts.append(element if count == 1 else f"{element}{count}")
    return "".join(parts)


def _amount_text(amount):
    """An exact amount (int, or a Fraction of decimal amounts) as a plain decimal: 3 -> '3', 1/8 ->
    '0.125', 1000000 -> '1000000'; never rounded, never in exponent form.  The denominator of a sum or
    product of decimal amounts divides a power of ten, so the decimal is finite."""
    if amount.denominator == 1:
        return str(int(amount))
    places = 1
    while (10 ** places) % amount.denominator:
        places += 1
    digits = str(amount.numerator * (10 ** places // amount.denominator)).rjust(places + 1, "0")
    return f"{digits[:-places]}.{digits[-places:]}"


def formula_explicit(formula):
    """``formula`` written as ``mp_e_form.csv`` writes formulas: elements in alphabetical order, every
    amount written (``Mg2Si`` -> ``Mg2Si1``; ``Ca3(PO4)2`` -> ``Ca3O8P2``).  Amounts are exact: the
    written value, or the exact sum of an element's amounts, as a plain decimal (``Fe1000000O`` ->
    ``Fe1000000O1``, ``Fe0.1234567O`` -> ``Fe0.1234567O1``, ``Fe2.0O3`` -> ``Fe2O3``); nothing is rounded.
    Raises ValueError as ``parse_formula`` does."""
    composition = _parse_formula_exact(formula)
    return "".join(f"{e}{_amount_text(composition[e])}" for e in sorted(composition))


_ELEMENT_POSITIONS = {}   # element list -> {symbol: column}, filled on first use


def element_fractions(formula, elements=FRACTION_ELEMENTS):
    """Atom fractions of ``formula`` as a list over ``elements`` (sums to 1).

    By default the vector has ``len(FRACTION_ELEMENTS) == 89`` entries
    (H..Bi plus Ac, Th, Pa, U, Np, Pu).  An element of the formula that is
    not in ``elements`` raises ValueError.
    """
    composition = parse_formula(formula)
    total = sum(composition.values())
    elements = tuple(elements)
    position = _ELEMENT_POSITIONS.get(elements)
    if position is None:
        position = _ELEMENT_POSITIONS[elements] = {e: i for i, e in enumerate(elements)}
    vector = [0.0] * len(elements)
    for element, amount in composition.items():
        if element not in position:
            raise ValueError(f"element {element!r} of formula {abbreviated(formula)} is not in the "
                             f"element list ({len(elements)} elements)")
        vector[position[element]] = amount / total
    return vector
