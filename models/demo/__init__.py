"""The bundled demo pair's build, one module per job: sources and corpus (corpus.py), tokenizer
(tokenizer.py), the target's pretraining (pretrain.py) and export (export.py), the target build
that runs them (target.py), the chat fine-tune (chat_finetune.py), the heads' data (heads.py)
and the whole pair's build (build.py)."""
