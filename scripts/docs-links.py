#!/usr/bin/env python3
"""Checks the links in Markdown files: README.md and the book in docs/src/ (scripts/docs-check).

Every relative link must name a file or directory inside the repository, and its #anchor a
heading (or an explicit id) of the Markdown file it names; no link may leave the repository
(`../shared/...` included). Web links (http, https, mailto) are counted, never fetched: there is no
network here. Links inside code (fenced blocks, `code spans`) are not links and are skipped.

Heading anchors follow mdBook's rule, which GitHub's matches for the headings we write: the
heading's text without its markup, lower-cased; letters, digits, `_` and `-` kept, each space
becomes `-`, everything else dropped; a repeated anchor gets `-1`, `-2`, ... appended.

    scripts/docs-links.py [--root DIR] FILE.md...

Prints `file:line: bad link 'TARGET': why` for each bad link and exits 1 if there is one;
otherwise a one-line summary and exit 0. Standard library only.
"""

import argparse
import os
import re
import sys

FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$")
EXPLICIT_ID = re.compile(r"\s*\{#([A-Za-z0-9_:.-]+)[^}]*\}\s*$")
HTML_ID = re.compile(r"""<[A-Za-z][^>]*\s(?:id|name)\s*=\s*["']([^"']+)["']""")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
# [text](target) or ![alt](target), the target optionally in <...> and followed by a "title".
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>\n]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)"
    r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)"
)
REFERENCE_DEF = re.compile(r"^ {0,3}\[([^\]]+)\]:\s*(<[^>]*>|\S+)", re.M)
AUTOLINK = re.compile(r"<([A-Za-z][A-Za-z0-9+.-]{1,31}:[^\s<>]*)>")
SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
GITHUB_LINE = re.compile(r"^L\d+(-L\d+)?$")


def blank_code(text):
    """The text with fenced code blocks and code spans replaced by spaces (newlines kept), so
    offsets and line numbers stay those of the file."""
    out, fence = [], None
    for line in text.splitlines(keepends=True):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            out.append(blank(line))
        elif fence is not None:
            if m and m.group(1).startswith(fence) and not line.strip()[len(m.group(1)):].strip():
                fence = None
            out.append(blank(line))
        else:
            out.append(line)
    text = "".join(out)
    return CODE_SPAN.sub(lambda m: blank(m.group(0)), text)


def blank(s):
    return re.sub(r"[^\n]", " ", s)


def heading_text(raw):
    """A heading's text as rendered: markup dropped, code spans and link texts kept."""
    s = re.sub(r"`+([^`]*)`+", r"\1", raw)
    s = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", s)
    s = re.sub(r"<[^>]+>", "", s)
    s = s.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
    return s


def slug(text):
    out = []
    for ch in heading_text(text):
        if ch.isalnum() or ch in "_-":
            out.append(ch.lower())
        elif ch.isspace():
            out.append("-")
    return "".join(out)


_anchor_cache = {}


def anchors(path):
    """Every anchor a Markdown file defines: its headings' slugs (deduplicated as mdBook and
    GitHub do), explicit `{#id}`s and HTML id/name attributes."""
    if path in _anchor_cache:
        return _anchor_cache[path]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    found, seen = set(), {}
    fence = None
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            continue
        if fence is not None:
            if m and m.group(1).startswith(fence):
                fence = None
            continue
        found.update(HTML_ID.findall(line))
        h = ATX_HEADING.match(line)
        if not h:
            continue
        content = h.group(2)
        explicit = EXPLICIT_ID.search(content)
        if explicit:
            found.add(explicit.group(1))
            continue
        s = slug(content)
        n = seen.get(s, 0)
        seen[s] = n + 1
        found.add(s if n == 0 else f"{s}-{n}")
    _anchor_cache[path] = found
    return found


def links(text):
    """(offset, target) of every link outside code, in the file's order."""
    return sorted(_links(blank_code(text)))


def _links(plain):
    for m in INLINE_LINK.finditer(plain):
        target = m.group(1)
        if target.startswith("<") and target.endswith(">"):
            target = target[1:-1]
        yield m.start(1), target
    for m in REFERENCE_DEF.finditer(plain):
        target = m.group(2).strip("<>")
        yield m.start(2), target
    for m in AUTOLINK.finditer(plain):
        yield m.start(1), m.group(1)


def check_target(root, source, target):
    """None if the link is good, else why not; and its kind ('web', 'local', 'anchor')."""
    if not target:
        return "empty link", "local"
    scheme = SCHEME.match(target)
    if scheme:
        if scheme.group(1).lower() in ("http", "https", "mailto"):
            return None, "web"
        return f"scheme {scheme.group(1)}: links go to the web or inside the repository", "local"
    if target.startswith("//"):
        return "protocol-relative link; write https://", "web"
    path, _, anchor = target.partition("#")
    path = path.split("?", 1)[0]
    if path.startswith("/"):
        return "absolute path; link relative to this file", "local"
    if path:
        resolved = os.path.normpath(os.path.join(os.path.dirname(source), path))
    else:
        resolved = source
    rel = os.path.relpath(resolved, root)
    if rel == ".." or rel.startswith(".." + os.sep) or os.path.isabs(rel):
        return f"leaves the repository (resolves to {resolved})", "local"
    real = os.path.realpath(resolved)
    if os.path.relpath(real, os.path.realpath(root)).startswith(".."):
        return f"leaves the repository through a symlink (resolves to {real})", "local"
    if not os.path.exists(resolved):
        return f"no such file: {rel}", "local"
    if not anchor:
        return None, "local"
    if os.path.isdir(resolved):
        return f"#{anchor} on a directory", "anchor"
    if not resolved.endswith(".md"):
        if GITHUB_LINE.match(anchor):
            return None, "anchor"
        return f"#{anchor} into {rel}, which is not Markdown", "anchor"
    if anchor not in anchors(resolved):
        return f"no heading with anchor #{anchor} in {rel}", "anchor"
    return None, "anchor"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=".", help="the repository's root (default: .)")
    ap.add_argument("files", nargs="+", help="Markdown files to check")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    bad, counts = 0, {"web": 0, "local": 0, "anchor": 0}
    for name in args.files:
        source = os.path.abspath(name)
        try:
            with open(source, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            print(f"{name}: cannot read: {e}", file=sys.stderr)
            bad += 1
            continue
        for offset, target in links(text):
            why, kind = check_target(root, source, target)
            counts[kind] += 1
            if why:
                line = text.count("\n", 0, offset) + 1
                print(f"{os.path.relpath(source, root)}:{line}: bad link '{target}': {why}")
                bad += 1
    summary = (
        f"{len(args.files)} files: {counts['local'] + counts['anchor']} links inside the "
        f"repository ({counts['anchor']} with an #anchor), {counts['web']} web links (not fetched)"
    )
    if bad:
        print(f"{bad} bad links; {summary}", file=sys.stderr)
        return 1
    print(f"links ok: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
