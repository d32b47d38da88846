"""Model out: what a trained run becomes, beyond its own checkpoints (docs/getting-started.md).

``source`` opens a RUN (a run's output directory, a checkpoints directory or one checkpoint)
as its model, weights, config and tokenizer; ``generate`` samples text from it with a KV cache;
``llama`` maps the reference transformer onto transformers' ``LlamaForCausalLM`` (and refuses
what does not map); ``export`` writes the directory transformers loads, with ``tokenizer_files``
and the model card of ``card``; ``verify`` is the only module that imports transformers (the
optional ``--verify``). ``importer`` is export's mirror (``speedtronic import``): ``source_model``
opens a transformers directory or Hub model, ``hf_config`` maps its ``config.json``; ``stops``
says where generation ends. Pushing an export is ``speedtronic.hub.models``'. Training imports
this package only for ``--init-from`` a transformers model (``train.init_source``).
"""
