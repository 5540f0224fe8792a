"""Run chapters as a fresh Colab runtime would, with no network but PyPI: `make test-colab`.

A chapter that works here can still fail in Colab, where nothing of this checkout exists: no
book/models, no ../shared/data, no cache. This harness gives each chapter such a runtime:
1. a venv (_build/colab/venv, rebuilt when its pins change) holding Colab's versions of the
   packages the book touches, from tools/colab/colab-packages.txt (its header names the source
   and the two deviations: this machine's Python and torch);
2. a local bare git repository standing in for the book's: a commit of the working tree
   (tracked and untracked-but-not-ignored files, so uncommitted work is what is tested) tagged
   BOOK_REPOSITORY_REF, reached through a private git config (url.<bare>.insteadOf =
   BOOK_REPOSITORY), so each chapter's setup cell really installs the package from it;
3. downloads answered from local copies and any other network use refused and recorded
   (tools/colab/sitecustomize.py, active in the kernel only): the book's raw files at the tag
   come from that commit, Multi30k and the NLTK treebank from ../shared/data (where that is
   missing, as on CI, from the module's cache, filled once by the harness);
4. each chapter copied alone into an empty folder under /tmp with an empty HOME, no
   MULTI30K_DIR or PTB_SAMPLE_DIR, OMP_NUM_THREADS=1, and its own copy of the Colab venv
   (hard links: a second or two), so its setup cell installs the package as in a fresh
   runtime and the venv that was built stays untouched; executed top to bottom with nbclient
   (tools/colab/run_notebook.py) in that copy, its python the kernel.
A chapter fails when a cell raises, when it touched the network outside the map, or when its
setup cell did not install the readers' command where Colab's shell finds it: after the run,
`annotated-transformer --help` must answer from the venv's bin/, first on PATH as /usr/local/bin
is in Colab.

The default set (DEFAULT_CHAPTERS), about five minutes here two at a time on a quiet machine:
every kind of download a chapter makes (the book's data and shipped models, Multi30k, the
treebank) in chapters that make them quickly (09, 16, 17, 18, 27, the data and performance
appendices) and in 20, the one chapter that reads the treebank; and two chapters that
download nothing (intro, 03) as a sample of the rest. `--all` runs every notebook in
_toc.yml: all 32 passed in 905 s here (2026-12-06, AMD EPYC, 2 cores, two at a time), too
long for `make test`'s budget; chapters 15, 20, 25 and 26 took three to five minutes each,
as they train or decode.
Notebooks come from colab/<stem>.ipynb when a folder colab/ exists (the Colab
versions of the chapters), else from book/; explicit notebook paths may be given instead.
usage: colab_check.py [--all] [--jobs 2] [--timeout 900] [--keep] [NOTEBOOK_OR_STEM ...]
"""

from __future__ import annotations

import argparse
import ast
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "tools" / "colab"
PINS = HERE / "colab-packages.txt"
BUILD = ROOT / "_build" / "colab"
TORCH = "torch==2.13.0"  # on this machine's disk; Colab's 2.11.0+cpu would download gigabytes
COLAB_PYTHON, COLAB_TORCH = "3.13", "2.11.0+cpu"
DEFAULT_CHAPTERS = ["intro", "03_attention", "09_training_data", "16_checkpoint_averaging",
                    "17_subword_vocabularies", "18_results", "20_constituency_parsing",
                    "27_conclusion", "appendix_data", "appendix_performance"]
REFUSED = {"url", "connect", "resolve"}  # log entries that fail a chapter
DROPPED_ENV = {"VIRTUAL_ENV", "MULTI30K_DIR", "PTB_SAMPLE_DIR", "PIP_REQUIRE_VIRTUALENV"}
COMMAND = "annotated-transformer"  # the package's console script (pyproject [project.scripts])


@dataclass
class Result:
    """One notebook's run: passed or not, how long, why not, what was served locally."""

    name: str
    ok: bool
    seconds: float
    error: str = ""
    served: int = 0
    folder: str = ""


def module_constants(names: list[str]) -> dict[str, str]:
    """String constants of the_annotated_transformer.py, read without importing torch."""
    tree = ast.parse((ROOT / "the_annotated_transformer.py").read_text(encoding="utf-8"))
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in names:
                found[target.id] = ast.literal_eval(node.value)
    missing = [name for name in names if name not in found]
    if missing:
        raise SystemExit(f"colab_check: the_annotated_transformer.py defines no {missing}")
    return found


def toc_stems() -> list[str]:
    """The notebooks of _toc.yml in book order (root first), as stems."""
    stems = []
    for line in (ROOT / "_toc.yml").read_text(encoding="utf-8").splitlines():
        key, _, value = line.strip().lstrip("- ").partition(":")
        if key in ("root", "file") and (ROOT / f"{value.strip()}.ipynb").is_file():
            stems.append(Path(value.strip()).name)
    return stems


def notebook_path(name: str) -> Path:
    """A stem's notebook (colab/ when that folder exists, else book/), or an explicit path."""
    if name.endswith(".ipynb"):
        path = Path(name).resolve()
    else:
        folder = ROOT / "colab" if (ROOT / "colab").is_dir() else ROOT / "book"
        path = folder / f"{name}.ipynb"
    if not path.is_file():
        raise SystemExit(f"colab_check: no notebook {path}")
    return path


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """A command that must succeed; its output is shown only when it fails."""
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        raise SystemExit(f"colab_check: {' '.join(command[:4])} ... failed:\n"
                         f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done


def site_packages(venv: Path) -> Path:
    """The venv's site-packages folder."""
    return next((venv / "lib").glob("python3*/site-packages"))


def ensure_venv(venv: Path) -> Path:
    """A Colab venv, built (a few minutes) when missing or when its pins changed."""
    stamp = venv / "colab-pins.sha256"
    wanted = hashlib.sha256(f"{PINS.read_text()}{TORCH}{sys.version}".encode()).hexdigest()
    if not stamp.is_file() or stamp.read_text() != wanted:
        print(f"building the Colab venv in {venv} from {PINS.relative_to(ROOT)} "
              "(a few minutes, once)", flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        run([sys.executable, "-m", "venv", str(venv)])
        run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
             "-r", str(PINS), TORCH])
        stamp.write_text(wanted)
    shutil.copyfile(HERE / "sitecustomize.py", site_packages(venv) / "sitecustomize.py")
    return venv


def git(*args: str, cwd: Path) -> str:
    """git with no user or system configuration."""
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    command = ["git", "-c", "user.name=colab-check", "-c", "user.email=colab-check@localhost",
               "-c", "init.defaultBranch=main", *args]
    return run(command, cwd=cwd, env=env).stdout


def working_tree_files() -> list[str]:
    """Tracked and untracked-but-not-ignored files that exist in the working tree."""
    listed = git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT)
    return sorted({name for name in listed.split("\0") if name and (ROOT / name).is_file()})


def make_remote(repository: str, ref: str) -> tuple[Path, Path]:
    """The working tree committed and tagged ref in a bare repository, and a git config that
    sends `repository` there; returns (the committed tree's folder, the git config file)."""
    tree, bare, config = BUILD / "tree", BUILD / "remote.git", BUILD / "gitconfig"
    shutil.rmtree(tree, ignore_errors=True)
    shutil.rmtree(bare, ignore_errors=True)
    for name in working_tree_files():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tree / name)
    git("init", "-q", cwd=tree)
    git("add", "-A", cwd=tree)
    git("commit", "-q", "-m", "the working tree, as tools/colab_check.py tests it", cwd=tree)
    git("tag", ref, cwd=tree)
    git("clone", "-q", "--bare", str(tree), str(bare), cwd=BUILD)
    config.write_text(f'[url "{bare.as_uri()}"]\n\tinsteadOf = {repository}\n')
    return tree, config


def local_data() -> tuple[Path, Path]:
    """Multi30k's folder and the treebank's file, found as the module finds them (the shared
    copy beside the repository here); downloaded into its cache once where there is none."""
    import the_annotated_transformer as tat

    multi30k = tat.multi30k_dir()
    for name in tat.MULTI30K_SHA256:
        tat.multi30k_file(name, multi30k)
    return multi30k, tat.ptb_sample_file(tat.ptb_sample_dir())


def url_map(tree: Path) -> dict[str, list[str]]:
    """Each URL (or prefix ending in /) the chapters download, and its local copies."""
    const = module_constants(["BOOK_REPOSITORY", "BOOK_REPOSITORY_REF", "MULTI30K_URL",
                              "PTB_SAMPLE_URL"])
    multi30k, treebank = local_data()
    return {
        f"{const['BOOK_REPOSITORY']}/raw/{const['BOOK_REPOSITORY_REF']}/": [str(tree)],
        const["MULTI30K_URL"]: [str(multi30k), str(multi30k.parent / "multi30k-fr-cs")],
        const["PTB_SAMPLE_URL"]: [str(treebank)],
    }


def chapter_env(folder: Path, venv: Path, git_config: Path, map_file: Path) -> dict[str, str]:
    """A fresh runtime's environment: empty HOME, no data folders or Python/Jupyter settings."""
    env = {key: value for key, value in os.environ.items()
           if key not in DROPPED_ENV and not key.startswith(("PYTHON", "JUPYTER", "IPYTHON"))}
    env.update(HOME=str(folder / "home"), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
               GIT_CONFIG_GLOBAL=str(git_config), GIT_CONFIG_NOSYSTEM="1",
               PIP_CACHE_DIR=str(BUILD / "pip-cache"),  # speed only: Colab downloads afresh
               COLAB_CHECK_URLS=str(map_file), COLAB_CHECK_LOG=str(folder / "network.jsonl"))
    return env


def fresh_venv(template: Path, venv: Path) -> Path:
    """A copy of the Colab venv for one notebook, as a fresh runtime's: files hard-linked (pip
    and Python replace files, never rewrite them, so the template stays as built), scripts in
    bin/ pointed at the copy."""
    try:
        run(["cp", "-al", str(template), str(venv)])
    except SystemExit:  # another file system: no hard links
        shutil.copytree(template, venv, symlinks=True)
    for script in (venv / "bin").iterdir():
        if script.is_file() and not script.is_symlink():
            text = script.read_bytes()
            if text.startswith(b"#!") and str(template).encode() in text:
                script.unlink()  # a new file: the template's stays as it is
                script.write_bytes(text.replace(str(template).encode(), str(venv).encode()))
                script.chmod(0o755)
    return venv


def command_error(venv: Path, env: dict[str, str]) -> str:
    """Why `annotated-transformer --help`, typed in a cell after the setup cell (`!` runs it in
    the shell), would fail in this runtime; "" when it prints its usage."""
    found = shutil.which(COMMAND, path=env["PATH"])
    if found is None or Path(found).parent != venv / "bin":
        return f"the setup cell installed no {COMMAND} command into the runtime's {venv / 'bin'}"
    done = subprocess.run([found, "--help"], env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or "usage:" not in done.stdout:
        lines = done.stderr.strip().splitlines() or [""]
        return f"{COMMAND} --help failed (status {done.returncode}): {lines[-1]}"
    return ""


def network_entries(log: Path) -> list[dict[str, str]]:
    """What the kernel's guard recorded."""
    if not log.is_file():
        return []
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line]


def run_notebook(notebook: Path, template: Path, git_config: Path, map_file: Path,
                 timeout: int) -> Result:
    """One notebook alone in an empty folder, in its own copy of the Colab venv; its Result."""
    start = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix=f"colab-check-{notebook.stem}-"))
    (folder / "home").mkdir()
    (folder / "work").mkdir()
    copy = folder / "work" / notebook.name
    shutil.copyfile(notebook, copy)
    venv = fresh_venv(template, folder / "venv")
    env = chapter_env(folder, venv, git_config, map_file)
    command = [str(venv / "bin" / "python"), str(HERE / "run_notebook.py"), str(copy),
               str(folder / "result.json"), "--timeout", str(timeout)]
    with open(folder / "runner.log", "w") as log:
        done = subprocess.run(command, cwd=copy.parent, env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    entries = network_entries(folder / "network.jsonl")
    refused = [entry for entry in entries if entry["kind"] in REFUSED]
    if (folder / "result.json").is_file():
        outcome = json.loads((folder / "result.json").read_text())
        ok, error = outcome["ok"], outcome["error"]
        if outcome["cell"] is not None:
            error = f"cell {outcome['cell']}: {error}"
    else:
        lines = (folder / "runner.log").read_text().strip().splitlines() or [""]
        ok, error = False, f"the runner stopped (status {done.returncode}): {lines[-1]}"
    if ok:
        error = command_error(venv, env)
        ok = not error
    if refused:
        ok = False
        error = (f"used the network outside the map ({refused[0]['kind']} "
                 f"{refused[0]['target']})" + (f"; {error}" if error else ""))
    return Result(notebook.stem, ok, time.monotonic() - start, error,
                  served=sum(entry["kind"] == "served" for entry in entries), folder=str(folder))


def check(notebooks: list[Path], *, jobs: int = 2, timeout: int = 900,
          keep: bool = False) -> list[Result]:
    """Run the notebooks as fresh Colab runtimes, `jobs` at a time; a Result for each."""
    BUILD.mkdir(parents=True, exist_ok=True)
    with open(BUILD / "lock", "w") as lock:  # runs share the venv and the remote: one at a time
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("waiting for another colab_check run to finish", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        return checked(notebooks, jobs=jobs, timeout=timeout, keep=keep)


def checked(notebooks: list[Path], *, jobs: int, timeout: int, keep: bool) -> list[Result]:
    """check() once it holds the lock."""
    template = ensure_venv(BUILD / "venv")
    const = module_constants(["BOOK_REPOSITORY", "BOOK_REPOSITORY_REF"])
    tree, git_config = make_remote(const["BOOK_REPOSITORY"], const["BOOK_REPOSITORY_REF"])
    map_file = BUILD / "urls.json"
    map_file.write_text(json.dumps(url_map(tree), indent=1))

    def one(notebook: Path) -> Result:
        result = run_notebook(notebook, template, git_config, map_file, timeout)
        status = "pass" if result.ok else "FAIL"
        served = f"{result.served} download(s) served locally"
        print(f"{status} {result.name:<30} {result.seconds:6.0f} s  {result.error or served}",
              flush=True)
        if not keep:  # a failure keeps its notebook and logs, not its copy of the venv
            shutil.rmtree(Path(result.folder) / ("venv" if not result.ok else ""),
                          ignore_errors=True)
        return result

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, notebooks))


def deviations() -> str:
    """How this stand-in differs from Colab, printed with every run."""
    return (f"Colab stand-in: Python {platform.python_version()} (Colab: {COLAB_PYTHON}), "
            f"{TORCH.replace('==', ' ')} CPU (Colab: torch {COLAB_TORCH}); every other package "
            f"at Colab's version ({PINS.relative_to(ROOT)})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="stems (27_conclusion) or .ipynb paths; "
                        "default: the default set")
    parser.add_argument("--all", action="store_true", help="every notebook in _toc.yml")
    parser.add_argument("--jobs", type=int, default=2, help="notebooks side by side")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    parser.add_argument("--keep", action="store_true", help="keep the folders of passing runs")
    args = parser.parse_args(argv)
    if args.all and args.notebooks:
        parser.error("give notebooks or --all, not both")
    if args.jobs < 1 or args.timeout < 1:
        parser.error("--jobs and --timeout must be at least 1")
    names = toc_stems() if args.all else (args.notebooks or DEFAULT_CHAPTERS)
    notebooks = [notebook_path(name) for name in names]
    print(deviations(), flush=True)
    print(f"running {len(notebooks)} notebook(s), {args.jobs} at a time", flush=True)
    start = time.monotonic()
    results = check(notebooks, jobs=args.jobs, timeout=args.timeout, keep=args.keep)
    failed = [result for result in results if not result.ok]
    for result in failed:
        print(f"failed: {result.name}: {result.error} (its files: {result.folder})")
    print(f"{len(results) - len(failed)} of {len(results)} passed in "
          f"{time.monotonic() - start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
