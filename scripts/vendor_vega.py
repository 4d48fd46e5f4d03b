"""Build `.dvc/plots/page.html`: DVC's plots page template with vega, vega-lite and vega-embed
inlined, so `dvc plots show` / `make plots` draw with no network (DVC's default page loads them from
a CDN). `.dvc/config`'s `plots.html_template` points DVC at it.

    python scripts/vendor_vega.py        # needs npm and the registry; writes the page and the licences

The versions are pinned here with their tarballs' sha256; vendor/vega/README.md says what is inside.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / ".dvc" / "plots" / "page.html"
LICENCES = ROOT / "vendor" / "vega"
# package, version, sha256 of its npm tarball, the browser build inlined
PACKAGES = (
    ("vega", "5.33.1", "1b8504b6731c5311be3269c4d84ca996a5cc293bc772283293ede20c490e16c3", "build/vega.min.js"),
    ("vega-lite", "5.23.0", "e4cbfdd8f6f1abe381c59cd558fd6a559c12b1496bfdf2e0c3295263a40fe4da",
     "build/vega-lite.min.js"),
    ("vega-embed", "6.29.0", "ecf1ee709c2bac9e0a4ead6908114b05b62c71493e10a8a4308109bb070f8eb1",
     "build/vega-embed.min.js"),
)
# dvc-render fills {refresh_tag} and {plot_divs}; the page has no {scripts}, so its CDN tags stay out
TEMPLATE = """<!DOCTYPE html>
<html>
<head>
    {{refresh_tag}}
    <meta charset="utf-8">
    <title>fasttrain: DVC plots</title>
    <!-- {versions}, inlined from npm (BSD-3-Clause: vendor/vega/), so the page draws offline.
         Made by scripts/vendor_vega.py. -->
{scripts}
    <style>
        table {{
            border-spacing: 15px;
        }}
    </style>
</head>
<body>
    {{plot_divs}}
</body>
</html>
"""


def fetch(package: str, version: str, sha256: str, workdir: Path) -> tarfile.TarFile:
    subprocess.run(["npm", "pack", "--silent", f"{package}@{version}"], cwd=workdir, check=True,
                   stdout=subprocess.DEVNULL)
    tarball = workdir / f"{package}-{version}.tgz"
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    if digest != sha256:
        sys.exit(f"{tarball.name}: sha256 {digest}, expected {sha256}")
    return tarfile.open(tarball)


def main() -> None:
    scripts = []
    with tempfile.TemporaryDirectory() as tmp:
        for package, version, sha256, build in PACKAGES:
            with fetch(package, version, sha256, Path(tmp)) as tar:
                code = tar.extractfile(f"package/{build}").read().decode()
                # a source map is a file next to the build: the page has none to point at
                code = "\n".join(line for line in code.splitlines() if not line.startswith("//# sourceMappingURL="))
                if "</script" in code or "{plot_divs}" in code or "{refresh_tag}" in code:
                    sys.exit(f"{package}: its build would break the page template")
                scripts.append(f"    <script>/* {package}@{version} */\n{code}\n    </script>")
                try:  # vega's tarball has none: vendor/vega/LICENSE-vega is its repository's
                    licence = tar.extractfile("package/LICENSE").read()
                    (LICENCES / f"LICENSE-{package}").write_bytes(licence)
                except KeyError:
                    pass
    versions = ", ".join(f"{p}@{v}" for p, v, _, _ in PACKAGES)
    PAGE.write_text(TEMPLATE.format(versions=versions, scripts="\n".join(scripts)))
    print(f"wrote {PAGE.relative_to(ROOT)} ({PAGE.stat().st_size / 2**10:.0f} KiB): {versions}")


if __name__ == "__main__":
    main()
