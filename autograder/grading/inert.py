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
import html
import re
from html.parser import HTMLParser

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


# The attributes that may stay, each then checked by value (safe_attribute).
ALLOWED_ATTRIBUTES = {
    "*": {"class", "id", "title", "style"}, "a": {"href"}, "img": {"src", "alt", "width", "height"},
    "col": {"width", "height", "align"}, "td": {"colspan", "rowspan", "align"},
    "th": {"colspan", "rowspan", "align"}, "tr": {"align"}, "ol": {"start"}, "details": {"open"},
    **{tag: MATHML_ATTRIBUTES for tag in MATH_TAGS},
}


def _squashed(url):
    """A URL as a browser reads its scheme: blanks and controls ignored, any case."""
    return re.sub(r"[`\x00-\x20\x7f-\xa0\s]+", "", url).lower()


def safe_attribute(tag, name, value):
    """Whether attribute `name`="`value`" of `tag` may stay: a short allow-list, links
    and images checked by value (style: only SAFE_CSS_PROPERTIES are kept of it)."""
    value = value.strip()
    if tag in MATH_TAGS and name in MATHML_ATTRIBUTES:
        return _MATH_VALUE.fullmatch(value) is not None
    if name in ("class", "id", "title", "style"):  # style: only SAFE_CSS_PROPERTIES stay of it
        return True
    if tag == "a" and name == "href":
        return _squashed(value).startswith(("http://", "https://", "mailto:", "#"))
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


_CHECKBOX = {"class", "type", "disabled", "checked"}  # a task list's box, as mistune writes it
_RASTER_ATTACHMENTS = ("image/png", "image/jpeg", "image/gif")


def _harmless_target(tag, value):
    """A link anywhere but a script (http, https, mailto, a fragment, a file of the
    hand-in); an image that loads nothing from elsewhere (a file of the hand-in or
    data:). `javascript:` runs in the formgrader's logged-in page when clicked, a remote
    image tells its server who opened the page and when."""
    squashed = _squashed(value)
    scheme = re.match(r"^([a-z][a-z0-9+.-]*):", squashed)
    if scheme is None:
        return not squashed.startswith(("//", "\\\\", "/\\", "\\/"))  # //host is remote
    if tag == "a":
        return scheme.group(1) in ("http", "https", "mailto")
    return _DATA_IMAGE.fullmatch(value.strip()) is not None


def _harmless_style(value):
    for declaration in filter(str.strip, value.split(";")):
        name, _, setting = declaration.partition(":")
        if name.strip().lower() not in SAFE_CSS_PROPERTIES or not re.fullmatch(
                r"[A-Za-z0-9 #%.,()-]*", setting.strip()) or "url" in setting.lower():
            return False
    return True


class _Inspection(HTMLParser):
    """Whether HTML holds only what the sanitizer would keep, and where it links to."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.harmless = True

    def handle_starttag(self, tag, attrs):
        if tag == "input":
            self.harmless &= all(name in _CHECKBOX for name, _ in attrs) and \
                ("type", "checkbox") in attrs
            return
        if tag not in SAFE_TAGS:
            self.harmless = False
            return
        allowed = ALLOWED_ATTRIBUTES["*"] | ALLOWED_ATTRIBUTES.get(tag, set())
        for name, value in attrs:
            value = value or ""
            if (tag, name) in (("a", "href"), ("img", "src")):
                self.harmless &= _harmless_target(tag, value)
            elif name == "style":
                self.harmless &= _harmless_style(value)
            else:
                self.harmless &= name in allowed and safe_attribute(tag, name, value)

    handle_startendtag = handle_starttag

    def handle_comment(self, data):
        self.harmless = False

    def handle_decl(self, decl):
        self.harmless = False

    def handle_pi(self, data):
        self.harmless = False

    def unknown_decl(self, data):
        self.harmless = False


def _rendered_as_nbgrader_does(text, attachments):
    """The HTML nbconvert makes of markdown `text` (the formgrader's renderer, which
    keeps `javascript:` links, remote images and raw HTML as they are)."""
    from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

    return MarkdownWithMath(renderer=IPythonRenderer(
        escape=False, attachments=attachments or {})).render(text)


def _raster_attachments(cell):
    """A markdown cell's pasted images, PNG, JPEG or GIF only (nbconvert draws them as
    data: images; an SVG could carry a script)."""
    kept = {}
    for name, bundle in (cell.get("attachments") or {}).items():
        images = {mime: data for mime, data in (bundle or {}).items()
                  if mime in _RASTER_ATTACHMENTS and isinstance(data, str)}
        if images:
            kept[name] = images
    return kept


def _inert_markdown(text, attachments=None):
    """Markdown that can neither run nor fetch anything when nbgrader renders it.

    Rendered as the formgrader renders it: when the HTML holds only what the sanitizer
    keeps, with links that run nothing and images from the hand-in itself, the cell is
    left as it is (quotes, comparisons and maths keep their characters); otherwise it
    becomes that HTML sanitized. What nbconvert cannot render (an image of a missing
    attachment) would break the formgrader's page, and is shown as text.
    """
    try:
        rendered = _rendered_as_nbgrader_does(text, attachments)
    except Exception:  # noqa: BLE001 - whatever nbconvert trips on, the page must not
        return f"<pre>{html.escape(text)}</pre>"
    inspection = _Inspection()
    inspection.feed(rendered)
    inspection.close()
    return text if inspection.harmless else sanitize_html(rendered)


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


_CELL_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # nbformat 4.5's rule


def _valid_cell_ids(nb):
    """Every cell id as nbformat requires it (valid and unique): one that is not stops
    nbconvert, and with it the formgrader's page and Generate Feedback."""
    seen = set()
    for number, cell in enumerate(nb.cells):
        if "id" not in cell:
            continue
        cell_id = cell["id"]
        if not isinstance(cell_id, str) or not _CELL_ID.fullmatch(cell_id) or cell_id in seen:
            cell_id = f"graded-{number}"
            while cell_id in seen:
                cell_id += "-again"
            cell["id"] = cell_id
        seen.add(cell_id)


def inert_graded_notebook(nb):
    """A copy of graded notebook `nb` that runs nothing when rendered: outputs keep
    only SHOWN_MIMETYPES (HTML and markdown sanitized, SVG dropped, as it can carry
    scripts), markdown cells lose any script or handler, raw cells are plain text,
    and the notebook's widget state is gone."""
    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)
    _valid_cell_ids(nb)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            attachments = _raster_attachments(cell)
            cell.pop("attachments", None)
            if attachments:
                cell.attachments = attachments
            cell.source = _inert_markdown(cell.source, attachments)
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
