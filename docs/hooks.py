"""MkDocs hooks of the paged-infer site (docs/mkdocs.yml names this file).

The notebooks write math as `$...$` and `$$...$$`. pymdownx.arithmatex finds it (and leaves `$` in code alone);
here it becomes MathML, which browsers draw natively: no MathJax, nothing loaded from the internet.
"""
import html
import re

from latex2mathml.converter import convert

_ARITHMATEX = re.compile(r'<(span|div) class="arithmatex">\\[(\[](.*?)\\[)\]]</\1>', re.DOTALL)


def to_mathml(m: re.Match) -> str:
    "MathML for one formula marked by arithmatex; its TeX source is kept if latex2mathml cannot read it."
    tex = html.unescape(m[2])
    try: return convert(tex, display='block' if m[1] == 'div' else 'inline')
    except Exception: return m[0]


def on_page_content(content: str, **kwargs) -> str:
    "Replace the formulas of a page's HTML by MathML."
    return _ARITHMATEX.sub(to_mathml, content)
