"""Recurrent layers: LSTM/GRU/RNN on padded batches through packed sequences, and plain."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .program import Program, idiom

_LENGTHS = torch.tensor([5, 3, 2])


class _Packed(nn.Module):
    def __init__(self, kind: type[nn.RNNBase]):
        super().__init__()
        self.rnn = kind(4, 6, batch_first=True)
        self.head = nn.Linear(6, 2)

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=True)
        out, _ = self.rnn(packed)
        padded, _ = pad_packed_sequence(out, batch_first=True)
        return self.head(padded)


@idiom("LSTM-packed-sequence")
def _lstm_packed() -> Program:
    return Program(_Packed(nn.LSTM), (torch.randn(3, 5, 4), _LENGTHS))


@idiom("GRU-packed-sequence")
def _gru_packed() -> Program:
    return Program(_Packed(nn.GRU), (torch.randn(3, 5, 4), _LENGTHS))


@idiom("RNN-packed-sequence")
def _rnn_packed() -> Program:
    return Program(_Packed(nn.RNN), (torch.randn(3, 5, 4), _LENGTHS))


class _Plain(nn.Module):
    def __init__(self, kind: type[nn.RNNBase], **kwargs):
        super().__init__()
        self.rnn = kind(4, 6, batch_first=True, **kwargs)
        self.head = nn.Linear(6 * (2 if kwargs.get("bidirectional") else 1), 2)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


@idiom("LSTM-two-layers")
def _lstm() -> Program:
    return Program(_Plain(nn.LSTM, num_layers=2), (torch.randn(3, 5, 4),))


@idiom("GRU-bidirectional")
def _gru_bi() -> Program:
    return Program(_Plain(nn.GRU, bidirectional=True), (torch.randn(3, 5, 4),))


class _LSTMCellLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(4, 6)
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        h = c = x.new_zeros(x.shape[0], 6)
        for t in range(x.shape[1]):
            h, c = self.cell(x[:, t], (h, c))
        return self.head(h)


@idiom("LSTMCell-python-loop")
def _lstm_cell() -> Program:
    return Program(_LSTMCellLoop(), (torch.randn(3, 5, 4),))
