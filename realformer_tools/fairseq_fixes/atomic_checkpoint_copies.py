"""Make fairseq's checkpoint copies atomic, so a killed training run can always resume.

Bug (fairseq 0.12): ``fairseq.checkpoint_utils.save_checkpoint`` writes the first checkpoint of its list
atomically (``torch_persistent_save``: ``<name>.tmp``, then ``os.rename``), but then
*copies* that file onto the others -- ``checkpoint_best.pt`` and ``checkpoint_last.pt``
-- with ``PathManager.copy`` (``shutil.copyfile``, or iopath's copy), which truncates the
destination first and fills it in place. A ``kill -9``, OOM kill, preemption or full disk
during that copy leaves a truncated ``checkpoint_last.pt``, which is exactly the file the
next ``fairseq-train`` run resumes from: the restart fails and the run is lost.

Fix: ``install`` (one of the fixes the launcher always installs) replaces
``fairseq.file_io.PathManager.copy`` -- every fairseq module shares that one class -- with
a copy that, for local paths, writes ``<dst>.copy.tmp`` in the destination directory,
fsyncs it and ``os.replace``s it onto ``<dst>``: at every instant ``<dst>`` is either the
complete old file or the complete new one. A kill can only leave the ``.copy.tmp`` file
behind (the next copy to that destination overwrites it; fairseq's checkpoint patterns
never match it). Remote (iopath URI) paths keep fairseq's own copy.

When it is no longer needed: fairseq's ``save_checkpoint`` writes every copy through
``torch_persistent_save`` (or an atomic rename); ``tests/test_reliability_resume.py``
shows the truncated ``checkpoint_last.pt`` that fairseq's own copy leaves.
"""

import contextlib
import os
import shutil

from fairseq.file_io import PathManager

__all__ = ["TMP_SUFFIX", "atomic_copy", "install", "install_atomic_checkpoint_copy"]

TMP_SUFFIX = ".copy.tmp"


def atomic_copy(src_path, dst_path):
    """Copy ``src_path`` to ``dst_path`` so that ``dst_path`` is never partially written."""
    tmp = dst_path + TMP_SUFFIX
    try:
        with open(src_path, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
            dst.flush()
            os.fsync(dst.fileno())  # data on disk before the name points at it
        os.replace(tmp, dst_path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    return True


# what install() replaces (module:attribute, as fairseq looks it up) and what that changes, for the
# launcher's log line and its restoring (realformer_tools.fairseq_fixes.fixes_installed)
REPLACES = (
    "fairseq.file_io:PathManager.copy",
)
CHANGES = ("checkpoint copies (checkpoint_best.pt, checkpoint_last.pt) written to a temporary file and "
           "renamed: a kill cannot truncate them")


def install_atomic_checkpoint_copy():
    """Wrap ``PathManager.copy`` (idempotent: an already wrapped copy is left alone)."""
    current = PathManager.__dict__["copy"].__func__  # a staticmethod
    if getattr(current, "__realformer_atomic__", False):
        return

    def copy(src_path, dst_path, overwrite=False):
        remote = any(map(PathManager.path_requires_pathmanager, (src_path, dst_path)))
        # iopath refuses overwrite=False onto an existing file; keep that answer. (Without
        # iopath, fairseq's shutil.copyfile always overwrites, and so does atomic_copy.)
        refused = not overwrite and _has_iopath() and os.path.exists(dst_path)
        if remote or refused:
            return current(src_path, dst_path, overwrite=overwrite)
        return atomic_copy(src_path, dst_path)

    copy.__realformer_atomic__ = True
    copy.__wrapped__ = current
    copy.__doc__ = atomic_copy.__doc__
    PathManager.copy = staticmethod(copy)


def _has_iopath():
    from fairseq import file_io

    return file_io.IOPathManager is not None


install = install_atomic_checkpoint_copy
