"""The hub's pages in headless Chromium: live search and tags, hostile content, the leaderboard.

One hub (a child process, since selenium blocks) serves three environments published over HTTP
and three eval runs attached to one of them; one Chromium session checks what a user relies on.
Hostile content (markup in a README, a summary, a keyword, eval defaults, a result's every string,
a file name and a yank reason an older hub let in) must stay text on every page, served or
exported, and no uploaded file may run as a script there.
Screenshots of the home and environment pages are left in /tmp/hub-shots/ for a person to look at.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
import pytest
from browser import chrome

from palaestra.hub.client import attach_results, upload
from palaestra.hub.data import HubData
from palaestra.hub.dist import DistInfo
from palaestra.runner import run_async
from palaestra.testing.hub import build_dists, hub_process, write_env_package

By = pytest.importorskip(
    "selenium.webdriver.common.by", reason="selenium not installed: pip install selenium"
).By
pytestmark = pytest.mark.slow  # three builds, two evals and a browser: about 10 s, more on a busy machine

SHOTS = Path("/tmp/hub-shots")
HOSTILE = """\
# Echo, hostile edition

<script>window.pwned=1</script>

<img src=x onerror="window.pwned=2">

[click](javascript:window.pwned=3)

| word | reply |
|------|-------|
| apple | apple |

```python
print("hello")
```
"""
MARKUP = '<img src=x onerror="window.pwned=5"><script>window.pwned=6</script>'
# a file an older hub took: markup in its name, JavaScript in its bytes
OLD_FILE = 'palaestra_env_echo-0.0.1-py3-none-<svg onload="window.pwned=7">.whl'
PACKAGES = {  # name: (module, environment, keywords, README)
    "palaestra-env-echo": ("echo_env", "echo", ("demo", "single-turn", MARKUP), HOSTILE),
    "palaestra-env-maze": ("maze_env", "maze", ("demo", "grid"), "# Maze\n\nFind the way out.\n"),
    "palaestra-env-quiz": ("quiz_env", "quiz", ("trivia", "single-turn"), "# Quiz\n\nAnswer questions.\n"),
}
ALL = sorted(PACKAGES)
ECHO = "palaestra-env-echo"
Hub = tuple[str, Any, Path]  # URL, driver, scratch folder (the data folder is its data/)


def palaestra(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "palaestra.cli", *args]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> None:
    output, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"{proc.args}: {output}"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    root = tmp_path_factory.mktemp("hub-browser")
    data = HubData(root / "data")
    catalog = data.catalog
    alice = catalog.add_user("alice")
    token = catalog.new_token("alice")
    add_old_file(data, alice)
    with contextlib.ExitStack() as stack:
        driver = chrome(
            root, flags=("--hide-scrollbars",), console_log=True
        )  # first, so that a machine without Chromium skips before the builds
        stack.callback(driver.quit)
        dists = {}
        for name, (module, env_name, keywords, readme) in PACKAGES.items():
            hostile = {"description": MARKUP, "eval_defaults": f"{orjson.dumps(MARKUP).decode()} = 1\n"}
            package = write_env_package(
                root / "src",
                name=name,
                module=module,
                env_name=env_name,
                keywords=keywords,
                readme=readme,
                **(hostile if name == ECHO else {}),
            )
            dists[name] = build_dists(package, root / "dist" / name)
        # a wheel unzipped is an installed package: importlib.metadata finds its entry point on PYTHONPATH
        with zipfile.ZipFile(dists["palaestra-env-echo"][0]) as wheel:
            wheel.extractall(root / "site")
        path = os.pathsep.join(filter(None, [str(root / "site"), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        evals = {}
        for policy in ("solve", "lazy"):
            evals[policy] = stack.enter_context(
                palaestra(
                    "eval",
                    "echo",
                    "-m",
                    f"scripted:echo_env:{policy}",
                    "-n",
                    "8",
                    "-r",
                    "1",
                    "-o",
                    str(root / policy),
                    "--quiet",
                    env=env,
                )
            )
            stack.callback(evals[policy].kill)  # runs before the Popen's exit, which waits for it
        url, _ = stack.enter_context(hub_process(root / "data"))
        for paths in dists.values():
            run_async(upload(url, token, paths))
        for policy, proc in evals.items():
            finish(proc)
            (run_dir,) = [p.parent for p in (root / policy).glob("evals/*/*/metadata.json")]
            hub_env = {**env, "PALAESTRA_HUB_URL": url, "PALAESTRA_HUB_TOKEN": token}
            finish(palaestra("hub", "results", str(run_dir), env=hub_env), timeout=60)
        run_async(attach_results(url, token, hostile_run(root / "hostile-run"), with_report=False))
        yield url, driver, root


def add_old_file(data: HubData, user: Any) -> None:
    """A release an older hub took, as it would be in the data folder: yanked, with markup everywhere."""
    fields = dict(
        summary=MARKUP,
        description=MARKUP,
        description_content_type="text/html",
        keywords=(MARKUP,),
        requires_dist=(MARKUP,),
        requires_python=MARKUP,
        environments=("echo",),
        eval_defaults={MARKUP: MARKUP},
        project_urls=(("x", "javascript:window.pwned=8"),),
        license=MARKUP,
    )
    payload = b"window.pwned = 9;\n"
    dist = DistInfo(
        filename=OLD_FILE,
        kind="wheel",
        name=ECHO,
        display_name=ECHO,
        version="0.0.1",
        sha256="0" * 64,
        size=len(payload),
        metadata=b"Metadata-Version: 2.1\n",
        **fields,
    )
    with data.catalog.adding_file(user, dist):
        data.path(ECHO, OLD_FILE).parent.mkdir(parents=True, exist_ok=True)
        data.path(ECHO, OLD_FILE).write_bytes(payload)
        data.path(ECHO, OLD_FILE + ".metadata").write_bytes(dist.metadata)
    data.catalog.set_yanked(user, ECHO, "0.0.1", yanked=True, reason=MARKUP)


def hostile_run(path: Path) -> Path:
    """A complete run of echo with markup in every string a board shows, served from a private host."""
    from palaestra.eval.store import METADATA, RESULTS

    path.mkdir(parents=True)
    (path / RESULTS).write_text("")
    meta = {
        "run_id": MARKUP,
        "env_id": "echo",
        "env_args": {"opponent": MARKUP},
        "model": MARKUP,
        "base_url": "http://user:hunter2@10.0.0.7:8000/v1",
        "sampling": {"temperature": 0.5, "extra": {MARKUP: MARKUP}},
        "num_examples": 8,
        "rollouts_per_example": 1,
        "seed": 3,
        "status": "complete",
        "finished_at": MARKUP,
        "versions": {"palaestra": MARKUP, "env_package": f"{ECHO} {MARKUP}"},
        "counts": {"errors": 0},
        "summary": {
            "n_examples": 8,
            "reward": {"mean": 0.75, "ci95": [0.5, 1.0], "n": 8},
            "metrics": {MARKUP: {"mean": 0.75}},
        },
    }
    (path / METADATA).write_bytes(orjson.dumps(meta))
    return path


def visible_cards(driver: Any) -> list[str]:
    cards = driver.find_elements(By.CSS_SELECTOR, "#cards .card")
    return sorted(card.find_element(By.TAG_NAME, "a").text for card in cards if card.is_displayed())


def test_home_lists_environments_and_filters_them_as_you_type(hub: Hub) -> None:
    url, driver, _ = hub
    driver.get(url)
    none = driver.find_element(By.ID, "none")
    assert visible_cards(driver) == ALL and not none.is_displayed()
    search = driver.find_element(By.ID, "q")
    search.send_keys("maze")
    assert visible_cards(driver) == ["palaestra-env-maze"]
    search.clear()
    search.send_keys("xylophone")
    assert visible_cards(driver) == [] and none.is_displayed() and none.text == "No environment matches."
    search.clear()
    search.send_keys(" ")  # clear() fires no input event; typing does
    assert visible_cards(driver) == ALL and not none.is_displayed()

    tag = driver.find_element(By.CSS_SELECTOR, "#tags .tag[href='?tag=trivia']")
    tag.click()
    assert visible_cards(driver) == ["palaestra-env-quiz"] and "active" in tag.get_attribute("class")
    assert driver.current_url == url  # filtered in the page, not by following the link
    tag.click()  # a second click drops the filter
    assert visible_cards(driver) == ALL
    driver.find_element(By.CSS_SELECTOR, "#cards .tag[href='?tag=single-turn']").click()  # a card's tag
    assert visible_cards(driver) == ["palaestra-env-echo", "palaestra-env-quiz"]


def test_query_in_the_url_filters_on_the_server_and_in_the_page(hub: Hub) -> None:
    url, driver, _ = hub
    with urllib.request.urlopen(url + "?q=quiz", timeout=10) as response:
        served = response.read().decode()
    cards = re.findall(r'<li class="card"[^>]*?( hidden)?><h2><a href="env/([^/"]+)/"', served)
    assert sorted(cards) == [
        ("", "palaestra-env-quiz"),
        (" hidden", "palaestra-env-echo"),
        (" hidden", "palaestra-env-maze"),
    ]
    driver.get(url + "?q=quiz")
    assert visible_cards(driver) == ["palaestra-env-quiz"]
    assert driver.find_element(By.ID, "q").get_attribute("value") == "quiz"


def test_readme_is_rendered_and_its_markup_is_inert(hub: Hub) -> None:
    url, driver, _ = hub
    driver.get(url + "env/palaestra-env-echo/")
    readme = driver.find_element(By.CSS_SELECTOR, "article.readme")
    assert readme.find_element(By.TAG_NAME, "h1").text == "Echo, hostile edition"
    assert [c.text for c in readme.find_elements(By.CSS_SELECTOR, "table td")] == ["apple", "apple"]
    assert readme.find_element(By.CSS_SELECTOR, "pre code").text == 'print("hello")'
    assert driver.execute_script("return typeof window.pwned") == "undefined"
    assert readme.find_elements(By.TAG_NAME, "script") == readme.find_elements(By.TAG_NAME, "img") == []
    assert "<script>window.pwned=1</script>" in readme.text and "[click](javascript:" in readme.text
    hrefs = [a.get_attribute("href") or "" for a in driver.find_elements(By.TAG_NAME, "a")]
    assert hrefs and not [h for h in hrefs if h.strip().lower().startswith("javascript:")]

    driver.execute_script("console.warn('log-marker')")
    try:
        log = driver.get_log("browser")
    except Exception:  # noqa: BLE001 - a driver that keeps no console log: skip only this check
        return
    assert any("log-marker" in e["message"] for e in log), log  # the log works: its silence means something
    assert [e["message"] for e in log if "Content Security Policy" in e["message"]] == []
    # and the policy is on: an inline script slipped into the page is refused, and logged as such
    inject = (
        "const s = document.createElement('script'); s.text = 'window.pwned = 4'; document.body.append(s)"
    )
    driver.execute_script(inject)
    assert driver.execute_script("return typeof window.pwned") == "undefined"
    assert any("Content Security Policy" in e["message"] for e in driver.get_log("browser"))


def test_leaderboard_ranks_runs_and_links_their_reports(hub: Hub) -> None:
    url, driver, _ = hub
    driver.get(url + "env/palaestra-env-echo/")
    # the board of echo with its default arguments (the hostile run has its own)
    board = driver.find_element(
        By.XPATH, "//section[@id='results']//h3[.//code[text()='default']]/following-sibling::div[1]//table"
    )
    head = [th.text for th in board.find_elements(By.CSS_SELECTOR, "thead th")]
    body = board.find_elements(By.CSS_SELECTOR, "tbody tr")
    rows = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")] for tr in body]
    assert [r[:3] for r in rows] == [
        ["1", "scripted:echo_env:solve", "1.000"],
        ["2", "scripted:echo_env:lazy", "0.500"],
    ]
    assert [r[head.index("n×r")] for r in rows] == ["8×1", "8×1"]
    assert [r[head.index("exact")] for r in rows] == ["1.000", "0.500"]  # the per-function column
    board.find_element(By.LINK_TEXT, "report").click()  # the first row's
    assert re.fullmatch(re.escape(url) + r"results/\d+/report\.html", driver.current_url)
    assert driver.title == "Palaestra report: echo · scripted:echo_env:solve"
    # the report's own script runs inside its sandbox: it fills in the rollout browser
    assert driver.find_element(By.CSS_SELECTOR, "#run-0 .browser .count").text == "8 of 8 rollouts shown"


def test_screenshots_of_the_home_and_environment_pages(hub: Hub) -> None:
    url, driver, root = hub
    driver.set_window_size(1280, 1400)
    SHOTS.mkdir(parents=True, exist_ok=True)
    for name, page in (("home", url), ("env", url + "env/palaestra-env-echo/")):
        driver.get(page)
        shot = root / f"{name}.png"
        assert driver.save_screenshot(str(shot))
        data = shot.read_bytes()
        width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and width == 1280 and height > 1000
        assert len(data) > 20_000, len(data)  # not a blank page
        shutil.copyfile(shot, SHOTS / f"{name}.png")


# hostile content: text on every page, and no uploaded file runs as a script


def settle(driver: Any) -> None:
    """Let what a page loaded run: an injected image's onerror, a deferred script."""
    driver.execute_async_script("const done = arguments[0]; setTimeout(done, 150)")


def load_script(driver: Any, src: str) -> str:
    """Add ``<script src=src>`` to the page: "loaded" or "blocked" (by the page's policy or the MIME type)."""
    return str(
        driver.execute_async_script(
            "const done = arguments[1], s = document.createElement('script'); s.src = arguments[0];"
            "s.onload = () => done('loaded'); s.onerror = () => done('blocked'); document.head.append(s);",
            src,
        )
    )


def assert_inert(driver: Any, page: str, file_url: str) -> None:
    driver.get(page)
    settle(driver)
    assert driver.execute_script("return typeof window.pwned") == "undefined", page
    injected = driver.execute_script(
        "return [...document.querySelectorAll('img[onerror], svg, iframe, object, embed, [onload]')]"
        ".map(e => e.outerHTML)"
    )
    assert injected == [], (page, injected)
    scripts = driver.execute_script("return [...document.scripts].map(s => s.src)")
    assert [s.rsplit("/", 2)[-2:] for s in scripts] == [["static", "hub.js"]], (page, scripts)
    assert MARKUP in driver.execute_script("return document.body.textContent"), page  # shown, as text
    hrefs = driver.execute_script("return [...document.links].map(a => a.href)")
    assert not [h for h in hrefs if h.lower().startswith("javascript:")], page
    # even markup that got in could not run an uploaded file: the page's policy allows hub.js only
    assert load_script(driver, file_url) == "blocked", page
    assert driver.execute_script("return typeof window.pwned") == "undefined", page


def pages_of(base: str, *, static: bool) -> list[str]:
    env = f"{base}env/{ECHO}/" + ("index.html" if static else "")
    return [base, env] if static else [base, env, f"{base}?q={quote(MARKUP)}", f"{base}?tag={quote(MARKUP)}"]


def test_hostile_content_is_inert_on_every_served_page(hub: Hub) -> None:
    url, driver, _ = hub
    old_file = f"{url}files/{ECHO}/{quote(OLD_FILE)}"
    for page in pages_of(url, static=False):
        assert_inert(driver, page, old_file)
    driver.get(url + f"env/{ECHO}/")  # the leaderboard shows the hostile run, its markup as text
    rows = [r.text for r in driver.find_elements(By.CSS_SELECTOR, "#results table.board tbody tr")]
    assert any(MARKUP in r for r in rows) and not any("hunter2" in r or "10.0.0.7" in r for r in rows)
    versions = driver.find_element(By.CSS_SELECTOR, "aside").text
    assert "0.0.1 yanked: " + MARKUP in versions


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # the test reads no request log
        pass


@contextlib.contextmanager
def static_server(folder: Path) -> Iterator[str]:
    """A plain file server over ``folder`` (as a static host would be: its own MIME types, no policy)."""
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_hostile_content_is_inert_in_the_static_export(hub: Hub) -> None:
    url, driver, root = hub
    out = root / "export"
    finish(
        palaestra(
            "hub",
            "export",
            str(out),
            "--data",
            str(root / "data"),
            "--url",
            "https://envs.example/",
            env=dict(os.environ),
        ),
        timeout=60,
    )
    # a page of the same origin without the pages' policy: there the old file does run, as a script
    (out / "probe.html").write_text("<!DOCTYPE html><title>probe</title><body></body>")
    with static_server(out) as base:
        old_file = f"{base}files/{ECHO}/{quote(OLD_FILE)}"
        driver.get(base + "probe.html")
        assert load_script(driver, old_file) == "loaded"
        assert driver.execute_script("return window.pwned") == 9  # what the policy of the pages stops
        # the hub itself serves that file as no script at all (nosniff), whatever the page's policy
        assert load_script(driver, f"{url}files/{ECHO}/{quote(OLD_FILE)}") == "blocked"
        for page in pages_of(base, static=True):
            assert_inert(driver, page, old_file)
        # an exported report still runs its own script, in its sandboxed frame
        driver.get(f"{base}env/{ECHO}/index.html")
        driver.find_element(By.LINK_TEXT, "report").click()
        driver.switch_to.frame(driver.find_element(By.TAG_NAME, "iframe"))
        assert driver.find_element(By.CSS_SELECTOR, "#run-0 .browser .count").text == "8 of 8 rollouts shown"
        driver.switch_to.default_content()
        # hub.js, allowed by its hash, still filters the exported list as you type
        driver.get(base)
        driver.find_element(By.ID, "q").send_keys("maze")
        assert visible_cards(driver) == ["palaestra-env-maze"]
        exported = "".join(
            p.read_text(errors="replace") for p in out.rglob("*") if p.suffix in (".html", ".json")
        )
        assert "hunter2" not in exported and "10.0.0.7" not in exported
