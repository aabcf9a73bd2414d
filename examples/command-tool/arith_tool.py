"""A tool for Grove's `command` environment, written in Python: reads one arithmetic expression on
stdin, prints its value. The model calls it as <tool>2 * (3 + 4)</tool> and reads <output>14</output>.

Only numbers, + - * / ** % // and parentheses are evaluated (Python's own parser, then a walk over
the syntax tree that refuses everything else); any other input is an error, printed on stdout with
a non-zero exit so Grove counts the call as failed.
"""
import ast
import operator
import sys

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.Pow: operator.pow, ast.Mod: operator.mod, ast.FloorDiv: operator.floordiv,
             ast.USub: operator.neg, ast.UAdd: operator.pos}


def evaluate(node):
    if isinstance(node, ast.Expression):
        return evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        if isinstance(node.op, ast.Pow) and abs(evaluate(node.right)) > 100:
            raise ValueError("exponent too large")
        return OPERATORS[type(node.op)](evaluate(node.left), evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](evaluate(node.operand))
    raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")


def main():
    text = sys.stdin.read().strip()
    try:
        value = evaluate(ast.parse(text, mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as e:
        print(f"error: {e}")
        return 1
    print(int(value) if float(value).is_integer() else round(value, 10), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
