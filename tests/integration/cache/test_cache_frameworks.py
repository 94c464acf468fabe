"""PyTorch DataLoader and tf.data over a real cache server: every sample once per epoch."""

from __future__ import annotations

import pytest

from microco.clients.cache import open_loader, register_dataset

pytestmark = pytest.mark.integration


@pytest.mark.torch
def test_torch_dataloader_substitutable_hits(make_dataset, tmp_path, etcd_kv, cache_server):
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from microco.clients.cache import make_dataloader

    files = make_dataset(tmp_path / "d", n=64, size=512)
    server = cache_server(capacity="16K")  # half the dataset
    _, idx = register_dataset(etcd_kv, "t", str(tmp_path / "d"), chunk_bytes=2048)
    loader = open_loader(
        etcd_kv, "t", server=server.address, batch_size=8, job_id="torch-job", prefetch=False
    )
    assert loader.warm() == len(idx.chunks) // 2
    labels = {p: int(p[5]) for p in files}  # class<k>/...
    dl = make_dataloader(
        loader,
        transform=lambda data, path: (
            torch.frombuffer(bytearray(data), dtype=torch.uint8).float().mean(),
            labels[path],
        ),
        collate_fn=lambda items: (torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])),
    )
    model = torch.nn.Linear(1, 3)
    for epoch in range(2):
        dl.batch_sampler.set_epoch(epoch)
        n = 0
        for x, y in dl:
            loss = torch.nn.functional.cross_entropy(model(x[:, None] / 255), y)
            model.zero_grad()
            loss.backward()
            with torch.no_grad():  # plain SGD; torch.optim's first step imports dynamo (~10 s)
                for p in model.parameters():
                    p -= 0.01 * p.grad
            n += len(y)
        assert n == len(files)
    seen = []
    dl.batch_sampler.set_epoch(2)
    for b in dl.batch_sampler:
        seen.extend(b)
    assert sorted(seen) == list(range(len(files)))
    # Half the chunks were cached, and chunks fetched whole on a miss add hits later in
    # the epoch: at least about half the samples came from the cache.
    assert loader.stats.hit_rate >= 0.4
    assert loader.stats.backing_bytes <= 3 * idx.total_bytes  # 3 epochs, nothing read twice
    loader.close()


@pytest.mark.tensorflow
def test_tf_data_reads_every_sample_once(make_dataset, tmp_path, etcd_kv, cache_server):
    tf = pytest.importorskip("tensorflow")
    from microco.clients.cache import quiver_tf_dataset

    files = make_dataset(tmp_path / "d", n=40, size=256)
    server = cache_server(capacity="1M")
    register_dataset(etcd_kv, "tfds", str(tmp_path / "d"), chunk_bytes=1024)
    loader = open_loader(
        etcd_kv, "tfds", server=server.address, batch_size=6, job_id="tf-job", prefetch=False
    )
    loader.warm()
    ds = quiver_tf_dataset(loader, epoch=0).map(lambda i, s: (i, tf.strings.length(s)))
    seen = []
    for indices, lengths in ds:
        seen.extend(indices.numpy().tolist())
        assert all(n == 256 for n in lengths.numpy())
    assert sorted(seen) == list(range(len(files)))
    assert loader.stats.hit_rate == 1.0
    loader.close()


@pytest.mark.tensorflow
def test_keras_fit_over_the_dataset_runs_a_new_epoch_each_pass(make_dataset, tmp_path, etcd_kv, cache_server):
    """``model.fit(quiver_tf_dataset(loader), epochs=3)``, as Keras users write it: each pass is
    the loader's next epoch (its own order), every sample once a pass. Before, every pass
    replayed epoch 0's order."""
    tf = pytest.importorskip("tensorflow")
    import keras

    from microco.clients.cache import quiver_tf_dataset

    make_dataset(tmp_path / "d", n=48, size=64)
    server = cache_server(capacity="1M")
    register_dataset(etcd_kv, "fitds", str(tmp_path / "d"), chunk_bytes=512)
    loader = open_loader(
        etcd_kv, "fitds", server=server.address, batch_size=8, job_id="fit-job", prefetch=False
    )

    def features(indices, samples):
        x = tf.cast(tf.io.decode_raw(samples, tf.uint8)[:, :8], tf.float32) / 255.0
        return x, tf.cast(indices % 2, tf.float32)

    ds = quiver_tf_dataset(loader).map(features)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    epochs = []

    class Seen(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            epochs.append(loader._epoch)

    model.fit(ds, epochs=3, verbose=0, callbacks=[Seen()])
    assert epochs == [0, 1, 2]
    resumed = quiver_tf_dataset(loader, first_epoch=5)
    assert sum(int(tf.size(i)) for i, _ in resumed) == 48 and loader._epoch == 5
    loader.close()
