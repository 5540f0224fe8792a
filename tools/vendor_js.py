"""Fetch the JavaScript the built book needs (Vega, Vega-Lite, vega-embed, MathJax) from npm.

The book must draw charts and typeset math with no network, so these libraries are served from
`_vendor/` (copied to `_static/` in the built book) instead of a CDN. Versions are pinned
(Vega-Lite matches altair's schema) and each tarball is checked against the integrity hash npm
published for it.
"""

import base64
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENDOR = ROOT / "_vendor"

# name, version, npm integrity, {path inside the package: path under _vendor}
PACKAGES = [
    (
        "vega",
        "6.4.0",
        "sha512-rHXCq2LpEWCLMjXBEj7hocY9G0/i5TGYRayGGSj06VTF4+l2IG2Z7oeZKCjWbUh/7hTE/mVhbaOPB72wCElh6g==",
        {"build/vega.min.js": "vega.min.js"},
    ),
    (
        "vega-lite",
        "6.4.1",
        "sha512-KO3ybHNouRK4A0al/+2fN9UqgTEfxrd/ntGLY933Hg5UOYotDVQdshR3zn7OfXwQ7uj0W96Vfa5R+QxO8am3IQ==",
        {"build/vega-lite.min.js": "vega-lite.min.js"},
    ),
    (
        "vega-embed",
        "7.3.0",
        "sha512-wQ8s5GaSzqoKgmRfbRolgBrjE2CP7ZKHXqH7NijxMqPjpdWxSs4Dn8tvp9g0giQvh2cK+3p56sxjWWM0wNngGw==",
        {"build/vega-embed.min.js": "vega-embed.min.js"},
    ),
    (
        "mathjax",
        "3.2.2",
        "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw==",
        {"es5": "mathjax"},
    ),
]


def integrity_of(path: Path) -> str:
    """npm's integrity string (sha512, base64) of a tarball."""
    digest = hashlib.sha512(path.read_bytes()).digest()
    return "sha512-" + base64.b64encode(digest).decode()


def fetch(name: str, version: str, integrity: str, files: dict[str, str]) -> None:
    """Download one package with `npm pack`, verify it, and copy the files we serve."""
    stamp = VENDOR / f".{name}-{version}"
    if stamp.exists():
        return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            ["npm", "pack", f"{name}@{version}", "--silent"], cwd=tmp, check=True,
            stdout=subprocess.DEVNULL,
        )
        tarball = next(Path(tmp).glob("*.tgz"))
        if integrity_of(tarball) != integrity:
            sys.exit(f"{name}@{version}: the tarball from npm does not match its pinned integrity")
        with tarfile.open(tarball) as tar:
            tar.extractall(tmp, filter="data")
        for source, target in files.items():
            src, dst = Path(tmp) / "package" / source, VENDOR / target
            if dst.exists():
                shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(src, dst) if src.is_dir() else shutil.copy2(src, dst)
    stamp.touch()
    print(f"vendored {name}@{version}")


def main() -> None:
    missing = [p for p in PACKAGES if not (VENDOR / f".{p[0]}-{p[1]}").exists()]
    if missing and shutil.which("npm") is None:
        sys.exit("vendor_js.py: npm is missing: install Node.js with npm (apt-get install -y npm) "
                 "to fetch the book's JavaScript")
    for package in missing:
        fetch(*package)


if __name__ == "__main__":
    main()
