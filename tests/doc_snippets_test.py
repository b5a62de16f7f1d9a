"""Every code block in README.md and docs/*.md runs as written, or says why
it does not.

A block is runnable when it is a fenced block whose info string is `sh` or
`python`, or an indented block right after a `<!-- snippet: sh -->` or
`<!-- snippet: python -->` line. A block that is not meant to run (output,
a fragment of a larger program, a command that builds with Bazel, which a
test cannot run) is a fenced block of another info string (`text`, `c`,
...) or any block right after `<!-- not-run: REASON -->`. Any other block
fails the test: a new snippet has to be run or be explained.

Runnable blocks run in document order, one document at a time, in a shell
(`bash -e -o pipefail`) or `python3`, against one opserver this test
starts on a free port, with:
  - `127.0.0.1:50051` (the documents' address) replaced by the server's;
    OPSERVER_ADDRESS set to it too;
  - the current directory a fresh one per document under $TEST_TMPDIR,
    holding links to the workspace's top-level entries, `bazel-bin`
    (a link to the workspace, where Bazel puts the built files the test
    depends on) and `out` (the prefix scripts/install.sh lays out, laid out
    here by the same scripts/lay_out_prefix.sh from the test's own build),
    so repository and installed paths work and what a snippet writes stays
    in the test's directory;
  - `grpcurl` (scripts/grpcurl) and `buf` first on PATH, as
    scripts/install-deps.sh puts them in /opt/opserver/tools/bin.
The blocks of one document share one shell session (a variable one block
sets, the next may use), so they run as one script.

    doc_snippets_test.py OPSERVER_BINARY [--list]
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

RUNNABLE = ("sh", "python")
MARKER = re.compile(r"^<!--\s*(snippet:\s*(\w+)|not-run:\s*(.+?))\s*-->\s*$")
DOC_ADDRESS = "127.0.0.1:50051"


class Block:
    def __init__(self, path, line, kind, text, reason=None):
        self.path, self.line, self.kind = path, line, kind
        self.text, self.reason = text, reason

    def where(self):
        return "%s:%d" % (self.path, self.line)


def blocks_of(path, text):
    """The code blocks of a Markdown document: (Block, error) pairs, with
    kind None for a block that is not run and error set when a block is
    neither runnable nor explained."""
    lines = text.split("\n")
    out = []
    marker = None  # (kind, reason) of the last marker line.
    i = 0
    previous_blank = True
    in_list = False
    while i < len(lines):
        line = lines[i]
        m = MARKER.match(line.strip())
        if m:
            marker = (m.group(2), m.group(3))
            i += 1
            continue
        fence = re.match(r"^(\s*)(```+|~~~+)\s*(\S*)", line)
        if fence:
            start = i
            close = fence.group(2)
            body = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(close):
                body.append(lines[i][len(fence.group(1)):])
                i += 1
            i += 1
            info = fence.group(3)
            if marker and marker[1]:
                out.append((Block(path, start + 1, None, "\n".join(body),
                                  marker[1]), None))
            elif info in RUNNABLE:
                out.append((Block(path, start + 1, info, "\n".join(body)),
                            None))
            else:
                out.append((Block(path, start + 1, None, "\n".join(body),
                                  "fenced as `%s`" % (info or "(none)")),
                            None if info else
                            "a fenced block without an info string"))
            marker = None
            previous_blank = False
            continue
        # An indented code block: 4 spaces after a blank line, not inside
        # a list item (whose continuation lines are indented too).
        if (line.startswith("    ") and previous_blank and not in_list
                and line.strip()):
            start = i
            body = []
            while i < len(lines) and (lines[i].startswith("    ") or
                                      not lines[i].strip()):
                body.append(lines[i][4:])
                i += 1
            while body and not body[-1].strip():
                body.pop()
            code = "\n".join(body)
            if marker and marker[0] in RUNNABLE:
                out.append((Block(path, start + 1, marker[0], code), None))
            elif marker and marker[1]:
                out.append((Block(path, start + 1, None, code, marker[1]),
                            None))
            else:
                out.append((Block(path, start + 1, None, code),
                            "an indented block with no <!-- snippet: sh|"
                            "python --> or <!-- not-run: reason --> line "
                            "before it"))
            marker = None
            previous_blank = True
            continue
        if line.strip():
            if re.match(r"^\s*([-*+]|\d+\.)\s", line):
                in_list = True
            elif not line.startswith(" "):
                in_list = False
            if marker and not line.startswith("    "):
                # A marker is for the block right after it.
                pass
        else:
            pass
        previous_blank = not line.strip()
        i += 1
    return out


def documents(root):
    paths = ["README.md"] + sorted(
        os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "docs",
                                                                 "*.md")))
    for path in paths:
        with open(os.path.join(root, path), encoding="utf-8") as f:
            yield path, f.read()


def script_of(blocks, address):
    """One document's runnable blocks as one bash script: each shell block
    as it is, each Python block through python3 (a heredoc; with the
    sanitizer runtimes the extension needs preloaded, if any), with the
    documents' address replaced."""
    parts = []
    for block in blocks:
        code = block.text.replace(DOC_ADDRESS, address)
        parts.append("echo '--- %s' >&2" % block.where())
        if block.kind == "sh":
            parts.append(code)
        else:
            parts.append("LD_PRELOAD=\"$SNIPPET_PYTHON_PRELOAD\" "
                         "python3 - <<'OPSERVER_SNIPPET_EOF'\n%s\n"
                         "OPSERVER_SNIPPET_EOF" % code)
    return "\n".join(parts) + "\n"


def sanitizer_runtimes(library):
    """The ASan/UBSan runtimes `library` links (an --config=asan build),
    else []."""
    libs = subprocess.run(["ldd", library], capture_output=True,
                          text=True).stdout
    return re.findall(r"=> (\S*lib(?:asan|ubsan)\.so\S*)", libs)


def installed_prefix(tmp, workspace):
    """The documents' `out/` prefix, laid out as scripts/install.sh does
    from the files this test's build made."""
    prefix = os.path.join(tmp, "out")
    shutil.rmtree(prefix, ignore_errors=True)
    subprocess.run([os.path.join(workspace, "scripts", "lay_out_prefix.sh"),
                    workspace, workspace, prefix], check=True)
    return prefix


def work_dir(tmp, name, workspace, prefix):
    """A fresh directory with links to the workspace's entries, bazel-bin
    linking to the workspace and out to the installed prefix."""
    path = os.path.join(tmp, "run", name.replace("/", "_"))
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    for entry in os.listdir(workspace):
        os.symlink(os.path.join(workspace, entry), os.path.join(path, entry))
    os.symlink(workspace, os.path.join(path, "bazel-bin"))
    os.symlink(prefix, os.path.join(path, "out"))
    return path


class Server:
    """The opserver binary on 127.0.0.1:0; stopped with the block."""

    def __init__(self, binary, tmp):
        self._log = open(os.path.join(tmp, "opserver.log"), "ab")
        self.process = subprocess.Popen(
            [binary, "--listen=127.0.0.1:0"], stdout=subprocess.PIPE,
            stderr=self._log)
        self.address = None
        deadline = time.time() + 60
        while time.time() < deadline:
            line = self.process.stdout.readline().decode()
            if not line:
                break
            m = re.match(r"listening on (127\.0\.0\.1:\d+)$", line.strip())
            if m:
                self.address = m.group(1)
                break
        if self.address is None:
            self.stop()
            raise RuntimeError("opserver did not start; see " + self._log.name)

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()
        self._log.close()


class DocSnippetsTest(unittest.TestCase):
    binary = None
    workspace = None

    def test_every_block_is_runnable_or_explained(self):
        errors = []
        for path, text in documents(self.workspace):
            for block, error in blocks_of(path, text):
                if error:
                    errors.append("%s: %s:\n    %s" % (
                        block.where(), error,
                        block.text.split("\n")[0][:100]))
        self.assertEqual(errors, [], "\n".join(errors))

    def test_runnable_blocks_run(self):
        tmp = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
        tools = os.environ.get("OPSERVER_TOOLS", "/opt/opserver/tools")
        buf = os.path.join(tools, "node_modules", ".bin", "buf")
        self.assertTrue(os.access(buf, os.X_OK),
                        "buf not found at %s; run scripts/install-deps.sh" %
                        buf)
        bin_dir = os.path.join(tmp, "bin")
        os.makedirs(bin_dir, exist_ok=True)
        for name, target in (("buf", buf), ("grpcurl", os.path.join(
                self.workspace, "scripts", "grpcurl"))):
            link = os.path.join(bin_dir, name)
            if os.path.lexists(link):
                os.remove(link)
            os.symlink(target, link)
        # An ASan build of libaclnn_remote.so links only into programs built
        # with the same sanitizers (as examples/examples_test.sh does).
        asan = sanitizer_runtimes(os.path.join(self.workspace, "client",
                                               "libaclnn_remote.so"))
        if asan:
            gxx = os.path.join(bin_dir, "g++")
            with open(gxx, "w") as f:
                f.write('#!/bin/sh\nexec /usr/bin/g++ '
                        '-fsanitize=address,undefined "$@"\n')
            os.chmod(gxx, 0o755)
        # Found, not imported: an ASan extension aborts an interpreter
        # started without its runtime.
        import importlib.util
        package = importlib.util.find_spec("opserver")
        preload = sanitizer_runtimes(os.path.join(
            os.path.dirname(package.origin), "_opserver.so"))
        home = os.path.join(tmp, "home")
        shutil.rmtree(home, ignore_errors=True)
        os.makedirs(home)
        prefix = installed_prefix(tmp, self.workspace)
        server = Server(self.binary, tmp)
        try:
            env = dict(os.environ, OPSERVER_ADDRESS=server.address,
                       PATH=bin_dir + ":" + os.environ.get("PATH", ""),
                       TMPDIR=tmp, HOME=home,
                       XDG_CACHE_HOME=os.path.join(home, ".cache"),
                       BUF_CACHE_DIR=os.path.join(tmp, "buf-cache"),
                       PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
                       SNIPPET_PYTHON_PRELOAD=":".join(preload),
                       ASAN_OPTIONS="detect_leaks=0")
            ran = 0
            for path, text in documents(self.workspace):
                blocks = [b for b, _ in blocks_of(path, text) if b.kind]
                if not blocks:
                    continue
                ran += len(blocks)
                script = script_of(blocks, server.address)
                result = subprocess.run(
                    ["bash", "-e", "-o", "pipefail", "-c", script],
                    cwd=work_dir(tmp, path, self.workspace, prefix), env=env,
                    capture_output=True,
                    text=True, timeout=300)
                self.assertEqual(
                    result.returncode, 0,
                    "%s: its snippets failed (exit %d); the last '---' line "
                    "names the block:\n%s\n%s" % (
                        path, result.returncode, result.stdout[-4000:],
                        result.stderr[-4000:]))
            self.assertGreater(ran, 0)
        finally:
            server.stop()


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    # The workspace: the runfiles tree Bazel runs the test in, or the
    # checkout when run by hand.
    DocSnippetsTest.workspace = os.getcwd()
    if "--list" in sys.argv:
        for path, text in documents(DocSnippetsTest.workspace):
            for block, error in blocks_of(path, text):
                print("%-28s %-7s %s | %s" % (
                    block.where(), block.kind or "-",
                    "ERROR " + error if error else (block.reason or ""),
                    block.text.split("\n")[0][:70]))
        return
    DocSnippetsTest.binary = os.path.abspath(args[0])
    unittest.main(argv=[sys.argv[0]])


if __name__ == "__main__":
    main()
