"""The built book in a real browser, offline: pages load cleanly, charts draw, math typesets.

Runs after `make book` (make test builds first). The browser is the Chromium or Chrome that
tools/find_browser.py finds (tools/ensure_chromium.sh installs one where it can); every request
that leaves the local test server is blocked and counted as a failure.
"""

import functools
import http.server
import re
import subprocess
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]

HTML = ROOT / "_build" / "html"

def built_pages() -> list[str]:
    """The book's own pages (one per _toc.yml entry), relative to _build/html."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]] + [c["file"] for part in toc["parts"] for c in part["chapters"]]
    return [f"{name}.html" for name in files]


@pytest.fixture(scope="module")
def server():
    if not (HTML / "index.html").exists():
        pytest.fail("the book is not built: run `make book` first")
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


def test_no_built_page_references_an_external_script():
    external = re.compile(r'<script[^>]*\bsrc="(https?:)?//', re.IGNORECASE)
    offenders = [
        str(p.relative_to(HTML)) for p in HTML.rglob("*.html") if external.search(p.read_text())
    ]
    assert offenders == []


# A page of the Chinese edition (tools/build_book.py builds it into _build/html/zh_CN) with
# charts and math: checked as every English page is, and below for its Chinese text.
CHINESE_PAGES = ["zh_CN/book/03_attention.html"]


@pytest.mark.parametrize("page_path", built_pages() + CHINESE_PAGES)
def test_page_renders_offline_with_charts_and_math(server, browser, page_path):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors, outside = [], []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))

    def only_local(route):
        if urlparse(route.request.url).netloc == urlparse(server).netloc:
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", only_local)
    page.goto(f"{server}/{page_path}", wait_until="load")

    charts = page.locator("div.book-chart").count()
    if charts:  # vega-embed marks each container it has drawn into and adds an svg or canvas
        page.wait_for_function(
            """n => [...document.querySelectorAll('div.book-chart')].filter(el => {
                   const g = el.querySelector('svg, canvas');
                   return g && g.getBoundingClientRect().width > 0
                          && g.getBoundingClientRect().height > 0;
               }).length === n""",
            arg=charts,
            timeout=30_000,
        )
    maths = page.locator(".math").count()
    if maths:
        page.wait_for_function(
            "n => document.querySelectorAll('mjx-container').length >= n", arg=maths,
            timeout=30_000,
        )
        assert page.locator("mjx-merror").count() == 0, "MathJax could not typeset some math"
    if page_path.endswith("book/03_attention.html"):  # attention's page shows both, by design
        assert charts >= 1 and maths >= 1
    if page_path == "book/intro.html":  # the front page's chart: the paper's Table 2
        assert charts >= 1

    screenshots = ROOT / "_build" / "screenshots"
    screenshots.mkdir(exist_ok=True)
    shot = screenshots / page_path.replace("/", "_").replace(".html", ".png")
    page.screenshot(full_page=True, path=str(shot))
    context.close()
    assert outside == [], f"requests that left the machine: {outside}"
    assert errors == [], f"console errors: {errors}"


# Two characters drawn in the page's own font: where no installed font has them, Chromium
# draws the same empty box for both, and the two images are equal.
DRAWS_CHINESE = """() => {
    const canvas = document.createElement('canvas');
    canvas.width = canvas.height = 48;
    const g = canvas.getContext('2d');
    const family = getComputedStyle(document.querySelector('.book-languages')).fontFamily;
    const draw = (text) => {
        g.clearRect(0, 0, 48, 48);
        g.font = `32px ${family}`;
        g.fillText(text, 4, 38);
        return g.getImageData(0, 0, 48, 48).data.join(',');
    };
    return draw('中') !== draw('文');
}"""


def test_a_chinese_page_reads_in_chinese_and_links_to_the_english(server, browser):
    fonts = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True)
    assert fonts.stdout.strip(), "no font with Chinese characters: run tools/ensure_chromium.sh"
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(server)
               else route.abort())
    page.goto(f"{server}/zh_CN/book/03_attention.html", wait_until="load")
    assert page.locator("html").get_attribute("lang") == "zh-CN"
    page.wait_for_function(
        """() => document.querySelectorAll('mjx-container').length > 0
                 && [...document.querySelectorAll('div.book-chart')]
                    .some(el => el.querySelector('svg, canvas'))""", timeout=30_000)
    text = page.locator("article").inner_text()
    # the translated text, or the note that the page is not translated yet
    assert re.search(r"[\u4e00-\u9fff]{4}", text), "no Chinese text on the Chinese page"
    assert page.evaluate(DRAWS_CHINESE), "Chinese characters draw as empty boxes (no CJK font)"
    english = page.locator("p.book-languages a[hreflang=en]")
    assert english.count() == 1
    with page.expect_navigation():
        english.click()
    assert page.url == f"{server}/book/03_attention.html"
    assert page.locator("html").get_attribute("lang") == "en"
    chinese = page.locator("p.book-languages a[hreflang=zh-CN]")
    with page.expect_navigation():
        chinese.click()
    assert page.url == f"{server}/zh_CN/book/03_attention.html"
    page.close()


# The narrowest window in which the theme shows its content column at full width.
FULL_WIDTH_VIEWPORT = {"width": 1440, "height": 900}


def test_no_code_cell_scrolls_sideways_at_the_books_full_width(server, browser):
    page = browser.new_page(viewport=FULL_WIDTH_VIEWPORT)
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(server)
               else route.abort())
    scrolling, cells = [], 0
    for page_path in built_pages():
        page.goto(f"{server}/{page_path}", wait_until="load")
        widths = page.evaluate(
            """() => [...document.querySelectorAll('div.cell_input pre')]
                   .filter(pre => pre.offsetParent !== null)
                   .map(pre => [pre.scrollWidth, pre.clientWidth])"""
        )
        cells += len(widths)
        scrolling += [f"{page_path}: {s} > {c} px" for s, c in widths if s > c]
    page.close()
    assert cells > 100, f"only {cells} visible code cells in the whole book"
    assert scrolling == [], "code cells that scroll sideways"


# The Colab editions (colab/, tools/colab_notebooks.py) store each chart also as HTML that loads
# vega, vega-lite and vega-embed from a CDN, because Colab's output frame draws HTML. Here every
# CDN request is answered with the vendored file of the same name and version, so the test
# shows what that output frame draws from the stored output alone, before any cell runs.
COLAB_CHART_PAGES = ["intro", "03_attention", "14_multi30k_training", "24_attention_visualization"]
CDN_SCRIPT = re.compile(r"https://cdn\.jsdelivr\.net/npm/([\w-]+)@[\d.]+/build/([\w.-]+\.js)$")


def stored_chart_html(stem: str) -> list[str]:
    """The text/html of every stored chart in colab/<stem>.ipynb."""
    import nbformat

    nb = nbformat.read(ROOT / "colab" / f"{stem}.ipynb", as_version=4)
    return ["".join(output["data"]["text/html"])
            for cell in nb.cells if cell.cell_type == "code"
            for output in cell.get("outputs", [])
            if "application/vnd.vegalite.v5+json" in output.get("data", {})]


@pytest.mark.parametrize("stem", COLAB_CHART_PAGES)
def test_colab_edition_draws_its_stored_charts(browser, stem, tmp_path):
    charts = stored_chart_html(stem)
    assert charts, f"colab/{stem}.ipynb stores no chart"
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors, outside = [], []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))

    def vendored(route):
        match = CDN_SCRIPT.match(route.request.url)
        vendor = ROOT / "_vendor" / match.group(2) if match else None
        if vendor is not None and vendor.is_file():
            route.fulfill(path=str(vendor), content_type="application/javascript")
        elif route.request.url.startswith("file://"):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", vendored)
    html = tmp_path / f"{stem}.html"
    html.write_text("<!DOCTYPE html><meta charset='utf-8'><body>" + "\n".join(charts))
    page.goto(html.as_uri(), wait_until="load")
    page.wait_for_function(
        """n => [...document.querySelectorAll('div[id^="colab-chart-"]')].filter(el => {
               const g = el.querySelector('svg, canvas');
               return g && g.getBoundingClientRect().width > 0;
           }).length === n""",
        arg=len(charts), timeout=30_000,
    )
    shots = ROOT / "_build" / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(full_page=True, path=str(shots / f"colab_{stem}.png"))
    page.close()
    assert outside == [], f"requests that the vendored files could not answer: {outside}"
    assert errors == [], f"console errors: {errors}"
