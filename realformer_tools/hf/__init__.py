"""Export of ``realformer_bert`` checkpoints to Hugging Face ``transformers``
(``realformer-export-hf``): ``hf_export`` (the command's work), ``hf_weights``,
``hf_tokenizer``, ``hf_model_card``; ``modeling/`` holds the self-contained modeling files
copied into every exported folder (they import neither this project nor fairseq)."""
