"""What the grader writes is inert: nothing a hand-in printed or displayed runs
when a person opens it.

The graded notebook (autograded/<student>/<assignment>/) is what nbgrader's
formgrader shows the instructor, inside a logged-in page that can change grades,
and what its Generate Feedback renders for the student. Both render HTML outputs,
markdown and raw HTML cells as they are, and JavaScript outputs run. So before it
is written, every output keeps only the mimetypes a page may show, with HTML,
markdown and SVG made inert (nh3, Python's binding of the Rust sanitizer ammonia), and the
student's markdown and raw cells are cleaned the same way. The feedback pages
(autograder/results/report.py) use the same sanitizer.
"""

import copy
import re

import nh3

# Output mimetypes the page shows (HTML, markdown and SVG sanitized or inert); every other
# one (application/javascript, widget views, mermaid, ...) is dropped before rendering.
SHOWN_MIMETYPES = {"text/plain", "text/html", "text/markdown", "text/latex", "image/png",
                   "image/jpeg", "image/svg+xml"}

# What survives of the rendered notebook (student markdown and outputs, and nbconvert's
# own markup around them). No script, style, frame, object, form, meta, link or svg.
SAFE_TAGS = {
    "a", "abbr", "b", "blockquote", "br", "caption", "cite", "code", "col", "colgroup", "dd",
    "del", "details", "dfn", "div", "dl", "dt", "em", "figcaption", "figure", "h1", "h2", "h3",
    "h4", "h5", "h6", "hr", "i", "img", "ins", "kbd", "li", "main", "mark", "ol", "p", "pre",
    "q", "s", "samp", "small", "span", "strike", "strong", "sub", "summary", "sup", "table",
    "tbody", "td", "tfoot", "th", "thead", "tr", "u", "ul", "var", "wbr",
} | {  # MathML, as latex2mathml writes the lessons' maths (no scripts, no links)
    "math", "mi", "mn", "mo", "ms", "mtext", "mspace", "mrow", "mfrac", "msqrt", "mroot",
    "mstyle", "merror", "mpadded", "mphantom", "menclose", "msub", "msup", "msubsup",
    "munder", "mover", "munderover", "mtable", "mtr", "mtd", "semantics", "annotation",
}
MATHML_ATTRIBUTES = {"display", "mathvariant", "stretchy", "fence", "separator", "accent",
                     "accentunder", "lspace", "rspace", "displaystyle", "scriptlevel",
                     "columnalign", "rowspacing", "columnspacing", "linethickness",
                     "minsize", "maxsize", "movablelimits", "symmetric", "notation",
                     "largeop", "form", "width", "depth", "height", "xmlns", "encoding"}
MATH_TAGS = {"math", "mi", "mn", "mo", "ms", "mtext", "mspace", "mrow", "mfrac", "msqrt",
             "mroot", "mstyle", "merror", "mpadded", "mphantom", "menclose", "msub", "msup",
             "msubsup", "munder", "mover", "munderover", "mtable", "mtr", "mtd", "semantics",
             "annotation"}
# Contents dropped along with the tag (stripping the tag alone would print them as text).
DROPPED_WITH_CONTENT = ["script", "style", "template", "noscript", "noembed", "noframes",
                        "iframe", "object", "textarea", "title", "xmp"]
# Colours and emphasis only (ANSI colours in tracebacks come as inline styles): nothing
# that places, sizes or layers an element.
SAFE_CSS_PROPERTIES = ["color", "background-color", "font-weight", "font-style",
                       "text-decoration", "text-align"]
_DATA_IMAGE = re.compile(r"data:image/(png|jpeg|gif|webp|svg\+xml);base64,[A-Za-z0-9+/=\s]*",
                         re.IGNORECASE)
_NUMBER = re.compile(r"\d{1,5}(\.\d{1,3})?(px|%)?")
_MATH_VALUE = re.compile(r"[A-Za-z0-9 .%#:/_-]{0,80}")
_MARKUP = re.compile(r"<[A-Za-z!/?]")


# The attributes that may stay, each then checked by value (safe_attribute).
ALLOWED_ATTRIBUTES = {
    "*": {"class", "id", "title", "style"}, "a": {"href"}, "img": {"src", "alt", "width", "height"},
    "col": {"width", "height", "align"}, "td": {"colspan", "rowspan", "align"},
    "th": {"colspan", "rowspan", "align"}, "tr": {"align"}, "ol": {"start"}, "details": {"open"},
    **{tag: MATHML_ATTRIBUTES for tag in MATH_TAGS},
}


def safe_attribute(tag, name, value):
    """Whether attribute `name`="`value`" of `tag` may stay: a short allow-list, links
    and images checked by value (style: only SAFE_CSS_PROPERTIES are kept of it)."""
    value = value.strip()
    if tag in MATH_TAGS and name in MATHML_ATTRIBUTES:
        return _MATH_VALUE.fullmatch(value) is not None
    if name in ("class", "id", "title", "style"):  # style: only SAFE_CSS_PROPERTIES stay of it
        return True
    if tag == "a" and name == "href":
        squashed = re.sub(r"[`\x00-\x20\x7f-\xa0\s]+", "", value).lower()
        return squashed.startswith(("http://", "https://", "mailto:", "#"))
    if tag == "img" and name == "src":
        return _DATA_IMAGE.fullmatch(value) is not None
    if tag == "img" and name == "alt":
        return True
    if tag in ("img", "col") and name in ("width", "height"):
        return _NUMBER.fullmatch(value) is not None
    if tag in ("td", "th") and name in ("colspan", "rowspan"):
        return value.isdigit()
    if tag == "ol" and name == "start":
        return value.isdigit()
    if tag in ("td", "th", "tr", "col") and name == "align":
        return value.lower() in ("left", "right", "center")
    if tag == "details" and name == "open":
        return True
    return False


_CLEANER = nh3.Cleaner(
    tags=SAFE_TAGS, clean_content_tags=set(DROPPED_WITH_CONTENT), attributes=ALLOWED_ATTRIBUTES,
    attribute_filter=lambda tag, name, value: value if safe_attribute(tag, name, value) else None,
    url_schemes={"http", "https", "mailto", "data"}, strip_comments=True,
    filter_style_properties=set(SAFE_CSS_PROPERTIES))


def sanitize_html(fragment):
    """Student-controlled HTML made inert: parsed as a browser would (HTML5) and
    rebuilt from the allow-lists above; a disallowed tag goes, its text stays, unless it
    is one of DROPPED_WITH_CONTENT."""
    return _CLEANER.clean(fragment)


_SIZE = re.compile(r"\d{1,5}")


def _inert_markdown(text):
    """Markdown with any HTML in it cleaned (markdown without tags is left alone, so
    that quotes and comparisons keep their characters)."""
    return sanitize_html(text) if _MARKUP.search(text) else text


def _inert_output_metadata(output):
    """Only a number may size an image: nbconvert writes width and height unquoted."""
    metadata = output.get("metadata")
    kept = {}
    for mimetype, sizes in (metadata.items() if isinstance(metadata, dict) else ()):
        if isinstance(sizes, dict):
            numbers = {k: v for k, v in sizes.items() if k in ("width", "height")
                       and _SIZE.fullmatch(str(v))}
            if numbers:
                kept[mimetype] = numbers
    if "metadata" in output:
        output["metadata"] = kept


def inert_graded_notebook(nb):
    """A copy of graded notebook `nb` that runs nothing when rendered: outputs keep
    only SHOWN_MIMETYPES (HTML and markdown sanitized, SVG dropped, as it can carry
    scripts), markdown cells lose any script or handler, raw cells are plain text,
    and the notebook's widget state is gone."""
    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = _inert_markdown(cell.source)
            cell.pop("attachments", None)
        elif cell.cell_type == "raw":
            cell.metadata.pop("raw_mimetype", None)
            cell.metadata.pop("format", None)
        for output in cell.get("outputs", []):
            _inert_output_metadata(output)
            data = output.get("data")
            if not data:
                continue
            for mimetype in list(data):
                if mimetype not in SHOWN_MIMETYPES or mimetype == "image/svg+xml":
                    del data[mimetype]
                elif mimetype == "text/html":
                    data[mimetype] = sanitize_html("".join(data[mimetype]))
                elif mimetype == "text/markdown":
                    data[mimetype] = _inert_markdown("".join(data[mimetype]))
            if not data:
                data["text/plain"] = "(an output the grader does not show: it could run code)"
    return nb
