"""The Hugging Face ``transformers`` code of ``realformer`` models, shipped as package data.

``configuration_realformer.py``, ``modeling_realformer_encoder.py`` (the encoder) and
``modeling_realformer.py`` (the heads) are self-contained (torch
and ``transformers`` only): ``scripts/export_hf.py`` copies them verbatim into every
exported folder, where ``AutoModel*.from_pretrained(DIR, trust_remote_code=True)`` loads
them. Importing this package does not import ``transformers``.
"""

import os

FILES = ("configuration_realformer.py", "modeling_realformer_encoder.py", "modeling_realformer.py")
HERE = os.path.dirname(os.path.abspath(__file__))
