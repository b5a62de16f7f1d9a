"""Drop-in replacements for torch.nn's activation modules, with the same
arguments, whose backward runs on an opserver (see opserver.torch).

    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), opserver.torch.nn.Hardswish(),
        opserver.torch.nn.Dropout(0.1), torch.nn.Linear(256, 10))

Each also takes ``session=``; without it, the calling thread's innermost
``opserver.torch.remote(session)`` block gives the session.
"""

import torch

from opserver import torch as _functions


class _Remote(torch.nn.Module):

    def __init__(self, session):
        super().__init__()
        self.session = session


class Threshold(_Remote):

    def __init__(self, threshold, value, inplace=False, session=None):
        super().__init__(session)
        self.threshold, self.value, self.inplace = threshold, value, inplace

    def forward(self, x):
        return _functions.threshold(x, self.threshold, self.value,
                                    self.inplace, self.session)

    def extra_repr(self):
        return "threshold={}, value={}{}".format(
            self.threshold, self.value, ", inplace=True" if self.inplace else "")


class Softshrink(_Remote):

    def __init__(self, lambd=0.5, session=None):
        super().__init__(session)
        self.lambd = lambd

    def forward(self, x):
        return _functions.softshrink(x, self.lambd, self.session)

    def extra_repr(self):
        return str(self.lambd)


class Hardswish(_Remote):

    def __init__(self, inplace=False, session=None):
        super().__init__(session)
        self.inplace = inplace

    def forward(self, x):
        return _functions.hardswish(x, self.inplace, self.session)


class LeakyReLU(_Remote):

    def __init__(self, negative_slope=0.01, inplace=False, session=None):
        super().__init__(session)
        self.negative_slope, self.inplace = negative_slope, inplace

    def forward(self, x):
        return _functions.leaky_relu(x, self.negative_slope, self.inplace,
                                     self.session)

    def extra_repr(self):
        return "negative_slope={}{}".format(
            self.negative_slope, ", inplace=True" if self.inplace else "")


class Dropout(_Remote):

    def __init__(self, p=0.5, inplace=False, session=None):
        super().__init__(session)
        if p < 0 or p > 1:
            raise ValueError("dropout probability has to be between 0 and 1, "
                             "but got {}".format(p))
        self.p, self.inplace = p, inplace

    def forward(self, x):
        return _functions.dropout(x, self.p, self.training, self.inplace,
                                  self.session)

    def extra_repr(self):
        return "p={}, inplace={}".format(self.p, self.inplace)
