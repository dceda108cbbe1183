"""Build offline.html, the `dvc plots show` page that works with no internet (see .dvc/config `plots`).

    make plots-template        # npm pack vega, vega-lite, vega-embed into .cache/npm, then this script

DVC's own page loads Vega from a CDN, so offline it is blank. This page inlines the three libraries'
minified builds (BSD-3-Clause, their package.json's license, named in the page) instead; DVC fills
`{plot_divs}` with the plots.
"""

import json
import sys
from pathlib import Path

PAGE = """<!DOCTYPE html>
<html>
<head>
    {refresh_tag}
    <meta charset="utf-8">
    <title>coa: dvc plots</title>
%s
    <style>
        body { font-family: sans-serif; margin: 1.5em; }
        body > div { display: inline-block; vertical-align: top; margin: 0 2em 2em 0; }
    </style>
</head>
<body>
    <h1>coa: dvc plots</h1>
    {plot_divs}
</body>
</html>
"""


def main(npm_dir: str) -> None:
    scripts = []
    for name in ("vega", "vega-lite", "vega-embed"):
        folder = next(p for p in Path(npm_dir).glob(f"{name}-[0-9]*") if p.is_dir())
        meta = json.loads((folder / "package.json").read_text())
        code = (folder / "build" / f"{name}.min.js").read_text()
        if "</script" in code or "{plot_divs}" in code:
            raise SystemExit(f"{folder}: the build cannot be inlined (it holds '</script' or '{{plot_divs}}')")
        scripts.append(f"    <!-- {name} {meta['version']} (npm), {meta['license']} license -->\n"
                       f"    <script>{code}</script>")
    sys.stdout.write(PAGE % "\n".join(scripts))


if __name__ == "__main__":
    main(sys.argv[1])
