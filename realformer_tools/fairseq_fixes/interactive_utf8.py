"""``fairseq-interactive`` dies on one invalid UTF-8 byte; replace it instead.

Bug (fairseq 0.12): ``fairseq_cli.interactive.buffered_read`` decodes its input
strictly, so one undecodable byte raises ``UnicodeDecodeError`` and the translations
of every line around it are lost.

Fix: undecodable bytes become U+FFFD (translated as ``<unk>``), with a warning per
line. Standard input is switched to ``errors="replace"`` only when it is a real text
stream that decodes bytes (``io.TextIOWrapper``: a terminal, a pipe, a file), and only
while it is read: its own setting is restored afterwards, so an in-process caller's
``sys.stdin`` is left as it was. Any other ``sys.stdin`` (the ``io.StringIO`` that code
driving ``fairseq_cli.interactive.main`` in-process installs, a notebook stream) already
holds text and is read exactly as fairseq reads it.

When it is no longer needed: ``printf 'a \\xff b\\n' | fairseq-interactive ...`` prints
a translation with the patch uninstalled.
"""

import fileinput
import logging
import sys

import fairseq_cli.interactive

logger = logging.getLogger(__name__)


def buffered_read(input, buffer_size):
    """``fairseq_cli.interactive.buffered_read``, replacing invalid UTF-8 instead of failing."""
    stdin, strictness = sys.stdin, getattr(sys.stdin, "errors", None)
    if input != "-" or not callable(getattr(stdin, "reconfigure", None)) or not isinstance(strictness, str):
        stdin = None  # a file (decoded by the hook below) or a stream that holds text already
    if stdin is not None:  # fileinput reads "-" from sys.stdin as is
        stdin.reconfigure(errors="replace")
    try:
        buffer = []
        hook = fileinput.hook_encoded("utf-8", errors="replace")
        with fileinput.input(files=[input], openhook=hook) as h:
            for src_str in h:
                if "\ufffd" in src_str:
                    logger.warning("input line %d is not valid UTF-8: undecodable bytes replaced",
                                   h.filelineno())
                buffer.append(src_str.strip())
                if len(buffer) >= buffer_size:
                    yield buffer
                    buffer = []
        if buffer:
            yield buffer
    finally:
        if stdin is not None and not getattr(stdin, "closed", False):
            stdin.reconfigure(errors=strictness)  # a caller's sys.stdin is left as it was


# what install() replaces (module:attribute, as fairseq looks it up) and what that changes, for the
# launcher's log line and its restoring (realformer_tools.fairseq_fixes.fixes_installed)
REPLACES = (
    "fairseq_cli.interactive:buffered_read",
)
CHANGES = ("fairseq-interactive replaces undecodable UTF-8 bytes (a warning per line) instead of dying")


def install():
    fairseq_cli.interactive.buffered_read = buffered_read
