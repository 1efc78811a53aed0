"""Google's released RealFormer (BERT) checkpoints into fairseq: ``tf_checkpoint`` reads
TensorFlow checkpoints (standard library + NumPy), ``google_mapping`` maps variables and
flags onto ``realformer_bert``, ``google_checkpoint`` reads a release and writes the
fairseq checkpoint (``realformer-convert-google-checkpoint``)."""
