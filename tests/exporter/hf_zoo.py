"""Tiny transformers models of each kind, from configs with random weights
(hidden 32, 2 layers), for the zoo test and its benchmark.

``MODELS`` maps a zoo name to (task, config maker). ``make(name)`` gives
the seeded model; ``save(name, folder)`` writes it as save_pretrained does,
with a tokenizer made here (no network: the tokenizers are trained on a few
lines of text): byte-level BPE with a ChatML template for the decoders,
WordPiece for BERT.
"""

import torch
import transformers as T
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXT = ["The capital of France is Paris.", "Tokenizers split text into pieces, then merge them by rank.",
        "Small models answer quickly; 12345 numbers and don't contractions.", "a b c d e f g hello world"] * 8
BPE_VOCAB = 320  # 256 bytes, the specials, and some merges


def _small(**kw):
    return dict(pad_token_id=0, bos_token_id=0, eos_token_id=2, **kw)


MODELS = {
    "bert": ("feature-extraction", lambda: T.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, pad_token_id=0)),
    "bert-mlm": ("fill-mask", lambda: T.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, pad_token_id=0)),
    "gpt2": ("text-generation", lambda: T.GPT2Config(
        vocab_size=BPE_VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=64, bos_token_id=0, eos_token_id=0)),
    "llama": ("text-generation", lambda: T.LlamaConfig(
        vocab_size=BPE_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=64, tie_word_embeddings=True,
        # Wider weights than the default 0.02: greedy text that varies
        # (at 0.02 a tiny model repeats one token), so it tells more apart.
        initializer_range=0.2, **_small())),
    "t5": ("feature-extraction", lambda: T.T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0)),
    "vit": ("image-classification", lambda: T.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
        patch_size=8, num_labels=3)),
    # The default feature encoder's layout, with 16 channels a layer.
    "wav2vec2": ("feature-extraction", lambda: T.Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, conv_dim=(16,) * 7,
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2)),
}


def make(name):
    task, config = MODELS[name]
    from aotid_export.hf import TASKS

    torch.manual_seed(list(MODELS).index(name))
    auto = getattr(T, TASKS[task])
    return auto.from_config(config()).eval()


def bpe_tokenizer():
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(TEXT, trainer)
    return T.PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|endoftext|>", eos_token="<|im_end|>",
                                     pad_token="<|endoftext|>", chat_template=CHATML)


def wordpiece_tokenizer():
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set("".join(TEXT).lower()) - {" "})
    tk = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return T.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                     sep_token="[SEP]", mask_token="[MASK]")


def save(name, folder):
    """The model as a folder, with the tokenizer its kind ships."""
    model = make(name)
    model.save_pretrained(folder)
    if name in ("gpt2", "llama"):
        bpe_tokenizer().save_pretrained(folder)
    elif name.startswith("bert"):
        wordpiece_tokenizer().save_pretrained(folder)
    return model
