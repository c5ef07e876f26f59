"""Source text of small user kernel files, written into a test's own project (tmp_path, pytester): a user's
file is imported by its path, never from the harness, so the tests that need one share this text."""

#: A plain loop of the linear recurrence h_t = a_t * h_{t-1} + b_t over the last axis: correct in every dtype.
LOOP_SCAN = '''\
import torch


def scan(a, b):
    h, out = torch.zeros_like(b[..., 0]), []
    for t in range(b.shape[-1]):
        h = a[..., t] * h + b[..., t]
        out.append(h)
    return torch.stack(out, -1)
'''
