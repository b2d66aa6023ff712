"""torch-geometric: GCN and GAT node classification, the two-layer models and full-batch loops of
PyG's ``gcn.py`` and ``gat.py`` examples (Cora's recipe: 20 labelled nodes per class, Adam with
weight decay 5e-4, dropout), on a graph built from scikit-learn's digits: each image a node with its
64 pixels as features, joined to its 10 nearest neighbours. Healthy: validation accuracy."""

from __future__ import annotations

from .case import Health


def _graph():
    import numpy as np
    import torch
    from sklearn.neighbors import kneighbors_graph
    from torch_geometric.data import Data
    from torch_geometric.utils import to_undirected

    from .data import digits

    x, y, order = digits()
    a = kneighbors_graph(x.numpy(), 10, include_self=False).tocoo()
    edge_index = to_undirected(torch.tensor(np.stack([a.row, a.col]), dtype=torch.long))
    train = torch.zeros(len(y), dtype=torch.bool)
    for c in range(10):
        train[order[y[order] == c][:20]] = True
    rest = order[~train[order]]
    val = torch.zeros_like(train)
    val[rest[:500]] = True
    return Data(x=x, edge_index=edge_index, y=y, train_mask=train, val_mask=val)


def _fit(model, data, optimizer, epochs: int):
    import torch.nn.functional as F

    from gradwidget import Recorder

    def accuracy() -> float:
        model.eval()
        pred = model(data.x, data.edge_index).argmax(dim=-1)
        model.train()
        return float((pred[data.val_mask] == data.y[data.val_mask]).float().mean())

    before = accuracy()
    with Recorder(model, optimizer) as rec:
        for _ in range(epochs):
            model.train()
            optimizer.zero_grad()
            out = model(data.x, data.edge_index)
            loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
            loss.backward()
            rec.log(loss=loss)
            optimizer.step()
    after = accuracy()
    return rec.run, Health("validation accuracy", before, after, "after >= 0.8", after >= 0.8)


def gcn_digits():
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import GCNConv

    class GCN(torch.nn.Module):
        def __init__(self, in_channels, hidden_channels, out_channels):
            super().__init__()
            self.conv1 = GCNConv(in_channels, hidden_channels, normalize=True)
            self.conv2 = GCNConv(hidden_channels, out_channels, normalize=True)

        def forward(self, x, edge_index):
            x = F.dropout(x, p=0.5, training=self.training)
            x = self.conv1(x, edge_index).relu()
            x = F.dropout(x, p=0.5, training=self.training)
            return self.conv2(x, edge_index)

    torch.manual_seed(0)
    data = _graph()
    model = GCN(64, 16, 10)
    optimizer = torch.optim.Adam(
        [
            dict(params=model.conv1.parameters(), weight_decay=5e-4),
            dict(params=model.conv2.parameters(), weight_decay=0),
        ],
        lr=0.01,
    )  # only the first layer is regularised, as in the example
    return _fit(model, data, optimizer, 200)


def gat_digits():
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import GATConv

    class GAT(torch.nn.Module):
        def __init__(self, in_channels, hidden_channels, out_channels, heads):
            super().__init__()
            self.conv1 = GATConv(in_channels, hidden_channels, heads, dropout=0.6)
            self.conv2 = GATConv(hidden_channels * heads, out_channels, heads=1, concat=False, dropout=0.6)

        def forward(self, x, edge_index):
            x = F.dropout(x, p=0.6, training=self.training)
            x = F.elu(self.conv1(x, edge_index))
            x = F.dropout(x, p=0.6, training=self.training)
            return self.conv2(x, edge_index)

    torch.manual_seed(0)
    data = _graph()
    model = GAT(64, 8, 10, heads=8)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.005, weight_decay=5e-4)
    return _fit(model, data, optimizer, 200)


def gcn_karate():
    """The GCN of PyG's introduction notebook on Zachary's karate club (bundled with PyG): three
    GCN layers of width 4, 4, 2 with tanh, a linear classifier, one labelled node per community,
    Adam at 0.01 for 401 epochs. Healthy: accuracy on the 30 unlabelled members."""
    import torch
    from torch.nn import Linear
    from torch_geometric.datasets import KarateClub
    from torch_geometric.nn import GCNConv

    from gradwidget import Recorder

    dataset = KarateClub()
    data = dataset[0]

    class GCN(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(1234)
            self.conv1 = GCNConv(dataset.num_features, 4)
            self.conv2 = GCNConv(4, 4)
            self.conv3 = GCNConv(4, 2)
            self.classifier = Linear(2, dataset.num_classes)

        def forward(self, x, edge_index):
            h = self.conv1(x, edge_index).tanh()
            h = self.conv2(h, edge_index).tanh()
            h = self.conv3(h, edge_index).tanh()
            return self.classifier(h), h

    def accuracy() -> float:
        with torch.no_grad():
            pred = model(data.x, data.edge_index)[0].argmax(dim=1)
        rest = ~data.train_mask
        return float((pred[rest] == data.y[rest]).float().mean())

    model = GCN()
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    before = accuracy()
    with Recorder(model, optimizer) as rec:
        for _ in range(401):
            optimizer.zero_grad()
            out, h = model(data.x, data.edge_index)
            loss = criterion(out[data.train_mask], data.y[data.train_mask])
            loss.backward()
            rec.log(loss=loss)
            optimizer.step()
    after = accuracy()
    return rec.run, Health("accuracy on unlabelled members", before, after, "after >= 0.7", after >= 0.7)
