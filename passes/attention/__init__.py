"""Attention: the passes that find it and the helpers they share.

``fuse.py`` is the ``fuse-attention`` pass (attention outlined for a flash kernel, forward, and
forward with backward in training steps), ``remat_loop.py`` the ``remat-loop-attention`` pass
(a scanned layer's attention recomputed in the backward loop so it fuses there too);
``match.py`` (recognizing attention and its kernel spec) and ``train.py`` (the training
match: the backward of an attention and the residuals it reads) are what both use.
"""
