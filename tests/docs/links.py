#!/usr/bin/python3
"""CTest docs/links: every relative link of README.md and docs/*.md names a file that exists and,
for a link into a Markdown page, a heading of that page (GitHub's anchor rule)."""
import glob
import os
import re
import sys


def anchors(path):
    out = set()
    with open(path) as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
    for m in re.finditer(r"^#+ (.*)$", text, flags=re.M):
        out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def main(root):
    bad = 0
    pages = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    for page in pages:
        with open(page) as f:
            text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            link = m.group(1)
            if re.match(r"[a-z]+:", link):
                continue
            path, _, anchor = link.partition("#")
            target = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            rel = os.path.relpath(page, root)
            if not os.path.exists(target):
                print(f"{rel}: link '{link}': no such file")
                bad += 1
            elif anchor and target.endswith(".md") and anchor not in anchors(target):
                print(f"{rel}: link '{link}': no heading '#{anchor}' in {os.path.relpath(target, root)}")
                bad += 1
    print(f"links: {len(pages)} pages, {bad} broken link(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
