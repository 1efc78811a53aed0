"""Installing and restoring a fix made of seams: ``(owner, attribute, wrap)`` triples, each
replacing ``owner.attribute`` by ``wrap(original)``. A wrapper carries ``FIXED`` (so installing
twice wraps once) and ``__wrapped__`` (the original, put back by ``uninstall_seams``)."""

FIXED = "__realformer_fixed__"


def install_seams(seams):
    for owner, name, wrap in seams:
        if not getattr(getattr(owner, name), FIXED, False):
            setattr(owner, name, wrap(getattr(owner, name)))


def uninstall_seams(seams):
    for owner, name, _ in seams:
        if getattr(getattr(owner, name), FIXED, False):
            setattr(owner, name, getattr(owner, name).__wrapped__)
