"""Print the folder of the installed ``realformer_nmt`` package: the value of fairseq's
``--user-dir`` outside a checkout.

  fairseq-train data-bin/multi30k_en_de --user-dir "$(realformer-nmt-user-dir)" --arch realformer_transformer ...

In a checkout ``--user-dir realformer_nmt`` (relative to the repository root) does the same.
"""

import argparse

from ._common import user_dir


def main(argv=None):
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    print(user_dir())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
