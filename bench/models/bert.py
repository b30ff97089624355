"""A BERT-base encoder from transformers' own `BertModel`, random weights from a config (hidden
768, 12 heads, intermediate 3072, `layers` of the 12), batch 1, a sequence of `seq` token ids and
an all-ones attention mask. The model returns the last hidden state.

    schedlang tune-model bench/models/bert.py -D layers=1 --trials 200
    schedlang build-model bench/models/bert.py -D layers=12 --compare
"""

import torch
from torch import nn

import schedlang


class Encoder(nn.Module):
    """BertModel's last hidden state (torch.export wants tensors out, not a ModelOutput)."""

    def __init__(self, bert: nn.Module):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask):
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


@schedlang.model
def bert(layers: int = 12, seq: int = 128):
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=layers, attn_implementation="eager")
    net = Encoder(BertModel(config, add_pooling_layer=False)).eval()
    ids = torch.randint(0, config.vocab_size, (1, seq))
    return net, (ids, torch.ones(1, seq, dtype=torch.long))
