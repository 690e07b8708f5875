"""The course website (``make book``): built offline from the committed notebooks, checked in a real browser.

The first tests read the built HTML. The browser test serves the site from 127.0.0.1, opens every page
in headless Chromium (Debian's ``chromium`` + ``chromium-driver``, driven by selenium) and checks that
the page logs no console error, its math is typeset by the site's own MathJax, every image has loaded,
and every internal link (and its #anchor) resolves; then that the navigation reaches every lesson.
It saves one screenshot per page under ``build/book/screenshots/``. Without Chromium it is skipped.
"""
from __future__ import annotations

import fcntl
import functools
import http.server
import html
import json
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

import pytest

from book import build as book

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "book"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def site():
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with open(OUT.parent / "book.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs in one checkout take turns with build/book
        yield book.build(OUT)


def _pages(html: Path) -> list[Path]:
    return sorted(p for p in html.rglob("*.html") if "_static" not in p.parts)


def test_every_lesson_and_module_has_a_page(site):
    notebooks = book.lessons()
    assert len(notebooks) >= 12
    for nb in notebooks:
        page = (site / "lessons" / f"{nb.stem}.html").read_text(encoding="utf-8")
        text = re.sub(r"<[^>]+>", "", page)
        # the "Run it" box comes right after the title, before the lesson's own text
        assert "Run it" in text and f"make lab → notebooks/{nb.name}" in text, nb.name
        assert re.search(rf"--nbval-sanitize-with tests/nbval_sanitize.cfg \\\s+notebooks/{nb.name}", text)
        title = json.loads(nb.read_text())["cells"][0]["source"][0].lstrip("# ").strip()
        h1 = re.search(r"<h1>(.*?)</h1>", page, re.S).group(1)
        assert re.sub(r"<[^>]+>", "", h1).rstrip("#").strip() == title
        assert page.index("Run it") < page.index("The question") if "The question" in page else True
        widgets = json.dumps(json.loads(nb.read_text())["cells"]).count(book.WIDGET)
        assert page.count('class="explorer-note"') == widgets, f"{nb.name}: explorers not described"
    for mod in book.modules():
        page = (site / "api" / f"{mod}.html").read_text(encoding="utf-8")
        assert f'id="module-posenc_lib.{mod}"' in page, f"{mod}: automodule produced nothing"
        assert (site / "_modules" / "posenc_lib" / f"{mod.replace('.', '/')}.html").is_file(), f"no source page for {mod}"
    warnings = (OUT / "warnings.txt").read_text()
    assert "failed to import" not in warnings, warnings[:2000]
    assert "xref_missing" not in warnings, warnings[:2000]  # a link to a page or file that is not there
    # any docutils or Sphinx warning (a broken docstring markup renders as red "problematic" text)
    assert not re.search(r"\b(WARNING|ERROR|CRITICAL)\b", warnings), warnings[:2000]
    for page in _pages(site):
        assert 'class="problematic"' not in page.read_text(encoding="utf-8"), f"{page}: markup error on the page"


def test_home_page_is_the_readme_and_pages_link_to_each_other(site):
    index = (site / "index.html").read_text(encoding="utf-8")
    readme_title = (ROOT / "README.md").read_text().splitlines()[0].lstrip("# ").strip()
    assert readme_title.split("—")[0].strip() in index
    for nb in book.lessons():
        assert f'href="lessons/{nb.stem}.html"' in index, nb.name
    # "lesson 03" in a lesson's prose links to lesson 03
    assert 'href="03_sinusoidal.html"' in (site / "lessons" / "06_rope.html").read_text(encoding="utf-8")
    # a lesson that teaches a module links to its page; the module page links back
    assert 'href="../api/schemes.rotary.html"' in (site / "lessons" / "06_rope.html").read_text(encoding="utf-8")
    assert 'href="../lessons/06_rope.html"' in (site / "api" / "schemes.rotary.html").read_text(encoding="utf-8")


def test_sidebar_groups_the_library_by_its_parts(site):
    """One caption per part of the library, with its one-line purpose, and each module under its part."""
    index = (site / "index.html").read_text(encoding="utf-8")
    text = html.unescape(re.sub(r"<[^>]+>", "", index))
    positions = []
    for part, summary, mods in book.parts():
        assert summary, f"{part} has no one-line purpose"
        assert summary.rstrip(".") in text, part
        positions.append(text.index(summary.rstrip(".")))
        for mod in mods:
            assert f'href="api/{mod}.html"' in index, mod
    assert positions == sorted(positions)  # in the order of book.PARTS
    assert [m for _, _, mods in book.parts() for m in mods if m.startswith("schemes.")][:3] == [
        "schemes.absolute", "schemes.sinusoidal", "schemes.shaw"]  # course order


def test_site_is_self_contained(site):
    """No page loads a script, style sheet or image from another host: the site works offline."""
    assert (site / ".nojekyll").is_file()
    assert (site / "_static" / "mathjax" / "tex-chtml-full.js").is_file()
    for page in _pages(site):
        text = page.read_text(encoding="utf-8")
        external = re.findall(r'<(?:script|img|link)\b[^>]*(?:src|href)="((?:https?:)?//[^"]+)"', text)
        assert not external, f"{page.relative_to(site)} loads {external}"


# ---------------------------------------------------------------- the browser


def _browser_or_skip():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        pytest.skip(f"no browser for the website test: {', '.join(missing)} missing "
                    "(install Debian's chromium and chromium-driver: apt-get install -y chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[dev]')")
    return webdriver


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server(site):
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def driver():
    webdriver = _browser_or_skip()
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # selenium must not try to download a browser or driver
    profile = tempfile.mkdtemp(prefix="posenc-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 f"--user-data-dir={profile}", "--window-size=1280,900"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    drv.set_page_load_timeout(60)
    drv.set_script_timeout(60)
    yield drv
    drv.quit()
    shutil.rmtree(profile, ignore_errors=True)


# Runs in the page after load: waits for MathJax and for every image, then reports what it found.
_INSPECT = """
const done = arguments[arguments.length - 1];
(async () => {
  const out = {};
  out.mathjax = window.MathJax && MathJax.version ? MathJax.version : null;
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  const math = Array.from(document.querySelectorAll('span.math, div.math'));
  out.math = math.length;
  out.untypeset = math.filter(e => !e.querySelector('mjx-container')).map(e => e.textContent.slice(0, 60));
  out.merror = Array.from(document.querySelectorAll('mjx-merror')).map(e => e.textContent.slice(0, 60));
  const imgs = Array.from(document.images);
  imgs.forEach(i => { i.loading = 'eager'; });
  await Promise.all(imgs.map(i => i.decode().catch(() => null)));
  out.images = imgs.length;
  out.broken = imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute('src'));
  out.links = Array.from(document.querySelectorAll('a[href]')).map(a => a.href);
  out.nav = Array.from(document.querySelectorAll('.bd-sidebar-primary a[href], nav a[href]')).map(a => a.href);
  out.next = Array.from(document.querySelectorAll('a.right-next')).map(a => a.href);
  done(out);
})().catch(e => done({error: String(e)}));
"""


def _ids(path: Path, cache: dict) -> set[str]:
    if path not in cache:
        cache[path] = set(re.findall(r'\bid="([^"]+)"', path.read_text(encoding="utf-8", errors="replace")))
    return cache[path]


def test_every_page_in_a_real_browser(site, server, driver):
    shots = OUT / "screenshots"
    if shots.exists():
        shutil.rmtree(shots)
    shots.mkdir(parents=True)
    problems, ids, nav, nexts = [], {}, {}, {}
    pages = _pages(site)
    lessons = [site / "lessons" / f"{nb.stem}.html" for nb in book.lessons()]
    math_pages = 0
    for page in pages:
        rel = page.relative_to(site).as_posix()
        driver.get(server + rel)
        found = driver.execute_async_script(_INSPECT)
        assert "error" not in found, f"{rel}: {found}"
        errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        if errors:
            problems.append(f"{rel}: console errors {errors[:3]}")
        if found["math"] and not str(found["mathjax"]).startswith("3."):
            problems.append(f"{rel}: MathJax 3 not loaded ({found['mathjax']})")
        if found["untypeset"] or found["merror"]:
            problems.append(f"{rel}: math not typeset {found['untypeset'][:3]} errors {found['merror'][:3]}")
        math_pages += found["math"] > 0
        if found["broken"]:
            problems.append(f"{rel}: images not loaded {found['broken'][:3]}")
        for href in found["links"]:
            if not href.startswith(server):
                continue
            url, frag = urldefrag(href)
            target = site / unquote(urlsplit(url).path.lstrip("/"))
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                problems.append(f"{rel}: link to missing {href[len(server):]}")
            elif frag and target.suffix == ".html" and unquote(frag) not in _ids(target, ids):
                problems.append(f"{rel}: link to missing anchor {href[len(server):]}")
        nav[rel], nexts[rel] = found["nav"], found["next"]
        driver.save_screenshot(str(shots / (rel.replace("/", "__")[:-5] + ".png")))
    assert not problems, "\n".join(problems[:40])
    assert math_pages >= len(lessons) // 2, f"math typeset on only {math_pages} pages"
    assert len(list(shots.glob("*.png"))) == len(pages)

    # navigation: the home page's sidebar lists every lesson, and "next" walks through them in order
    listed = {urldefrag(h)[0] for h in nav["index.html"]}
    for lesson in lessons:
        assert server + lesson.relative_to(site).as_posix() in listed, f"sidebar misses {lesson.name}"
    walk, rel = [], lessons[0].relative_to(site).as_posix()
    while rel in nexts and rel.startswith("lessons/") and len(walk) < 100:
        walk.append(rel)
        rel = urldefrag(nexts[rel][0])[0][len(server):] if nexts[rel] else ""
    assert walk == [lesson.relative_to(site).as_posix() for lesson in lessons]
