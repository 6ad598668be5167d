"""k-means for the calibration: deterministic for a generator, no empty cluster, D^2 seeding."""

import pytest
import torch

from acoustic_mlm.tokenizer.kmeans import kmeans


def test_kmeans_deterministic_no_empty_clusters():
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(40, 8, generator=g) * 5
    x = centers[torch.randint(40, (3000,), generator=g)] + 0.1 * torch.randn(3000, 8, generator=g)
    for init in ("plusplus", "random"):
        c1, n1 = kmeans(x, 64, 10, torch.Generator().manual_seed(1), init=init)
        c2, n2 = kmeans(x, 64, 10, torch.Generator().manual_seed(1), init=init)
        assert torch.equal(c1, c2) and torch.equal(n1, n2)
        assert c1.shape == (64, 8) and int(n1.sum()) == 3000 and bool((n1 > 0).all())
        if init == "plusplus":  # D^2 seeding finds every blob: no point is far from its centroid
            idx = torch.cdist(x, c1).argmin(1)
            assert float((x - c1[idx]).norm(dim=1).max()) < 1.0
    with pytest.raises(ValueError, match="N >= k"):
        kmeans(x[:10], 64, 3, torch.Generator())
