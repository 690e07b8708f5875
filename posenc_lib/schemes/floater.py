"""FLOATER: position codes from a neural ODE (Liu, Yu, Dhillon & Hsieh 2020, "Learning to Encode
Position for Transformer with Continuous Dynamical Model", arXiv:2003.09229).

Instead of a table or a fixed formula, the code of position ``t`` is the state of a learned
continuous dynamical system:

    p(t) = p(s) + integral_s^t h(tau, p(tau); theta) d tau,        p(0) = p0 (learned)

``h`` is a small network.  Any real position has a code (no table to run out of), and with
``h = 0`` the code is constant; the paper shows the sinusoidal code is one solution of such a
system.  The cost is the integration: the codes of positions ``0..L-1`` come from ``L - 1``
sequential solver steps (each a few evaluations of ``h``), and training back-propagates through
them.  Positions do not depend on the tokens, so the codes can be computed once per length and
cached; the paper adds them in every layer.

Here: a fixed-step fourth-order Runge-Kutta solver (``steps_per_unit`` steps per position).

Taught in notebooks/11_beyond_the_classics.ipynb (section "Two more schemes from the survey").
"""
from __future__ import annotations

import torch
from torch import nn

from ..checks import check_positive_int


class Floater(nn.Module):
    """``Floater(dim)(L) -> (L, dim)`` codes ``p(0), ..., p(L-1)`` of the ODE ``dp/dt = h(t, p)``."""

    def __init__(self, dim: int, hidden: int = 32, steps_per_unit: int = 1):
        super().__init__()
        self.dim = check_positive_int("dim", dim)
        self.steps_per_unit = check_positive_int("steps_per_unit", steps_per_unit)
        self.p0 = nn.Parameter(torch.randn(dim) * 0.1)
        self.h = nn.Sequential(nn.Linear(dim + 1, check_positive_int("hidden", hidden)), nn.Tanh(), nn.Linear(hidden, dim))
        self.evaluations = 0  # calls of h in the last forward (the cost a table lookup does not have)

    def dynamics(self, t: float, p: torch.Tensor) -> torch.Tensor:
        self.evaluations += 1
        return self.h(torch.cat((p, p.new_full((1,), t / 100.0))))  # time scaled so long positions stay in range

    def forward(self, length: int) -> torch.Tensor:
        length = check_positive_int("length", length)
        self.evaluations = 0
        dt = 1.0 / self.steps_per_unit
        p, t, codes = self.p0, 0.0, [self.p0]
        for _ in range((length - 1) * self.steps_per_unit):   # sequential: step n needs step n - 1
            k1 = self.dynamics(t, p)
            k2 = self.dynamics(t + dt / 2, p + dt / 2 * k1)
            k3 = self.dynamics(t + dt / 2, p + dt / 2 * k2)
            k4 = self.dynamics(t + dt, p + dt * k3)
            p, t = p + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4), t + dt
            if round(t * self.steps_per_unit) % self.steps_per_unit == 0:
                codes.append(p)
        return torch.stack(codes)
