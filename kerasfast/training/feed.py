"""The data phase: the training data read once into a batched pipeline
(which a batch-size search re-batches), Keras's validation arguments, and
the stream each training step reads from."""

from __future__ import annotations

import os

from kerasfast import _compat
from kerasfast.data import service
from kerasfast.distribute import ray_train
from kerasfast.errors import PlanError
from kerasfast.training.batch_callbacks import per_batch_callbacks
from kerasfast.training.data_errors import damage_named
from kerasfast.training.guard import check_finite
from kerasfast.training.inputs import (check_validation_data, prepare_data, sharded_tfrecord_stream,
                                       split_validation, tuple_is_model_inputs, unpacked, validation_arguments)
from kerasfast.training.loop import stream_factory
from kerasfast.training.run import Run


def prepare(run: Run, batch_size: int | None) -> None:
    """Reads the training data (`run.train_data`) and Keras's validation arguments (`run.validation`).

    Splits off `validation_split` (updating `run.feed`), refuses what the
    data path cannot serve, and checks arrays for NaN unless `on_nan="ignore"`.
    """
    feed, args = run.feed, run.args
    # A tuple x without y: the model's inputs where only they can be meant (as Keras reads it), else (x, y[, w]).
    model_inputs = feed.y is None and feed.sample_weight is None and tuple_is_model_inputs(
        run.model, feed.x, loss=args.loss, metrics=args.metrics)
    if not model_inputs:
        feed.x, feed.y, feed.sample_weight = unpacked(feed.x, feed.y, feed.sample_weight)
    if args.validation_split and feed.validation_data is None:
        (feed.x, feed.y, feed.sample_weight), feed.validation_data = split_validation(
            feed.x, feed.y, feed.sample_weight, args.validation_split)
    if model_inputs:
        feed.x = list(feed.x)  # the inputs as a list, which no later step reads as (x, y)
    if feed.class_weight is not None and isinstance(feed.x, (str, os.PathLike)) \
            and run.distribution.name == "multi_worker":
        raise PlanError("class_weight= is not applied to TFRecords read per worker: write the weights into the "
                        "records (a sample_weight feature) or train on one machine.")
    if isinstance(feed.validation_data, ray_train.RayShard):
        raise PlanError("validation_data= is a Ray Data shard (ray_dataset), which kerasfast reads as training data "
                        "only: pass the validation rows as arrays (e.g. ray_dataset(...).arrays() of the validation "
                        "shard), or a tf.data.Dataset.")
    if isinstance(feed.x, ray_train.RayShard):  # each worker's own rows (kerasfast.distribute.ray_dataset)
        feed.x = feed.x.weighted(feed.class_weight)
    if args.on_nan != "ignore":
        arrays = feed.x.arrays() if isinstance(feed.x, ray_train.RayShard) else (feed.x, feed.y, feed.sample_weight)
        for what, value in zip(("x", "y", "sample_weight"), arrays, strict=True):
            check_finite(value, what)
        if isinstance(feed.validation_data, (tuple, list)):  # arrays as (x, y[, sample_weight])
            for index, value in enumerate(feed.validation_data):
                check_finite(value, f"validation_data[{index}]")
    with damage_named(feed.x, feed.validation_data):
        _read(run, batch_size)
    _refuse_endless_epochs(feed.x, args.steps_per_epoch, args.callbacks)
    if feed.data_service is not None:
        service.check_servable(feed.data_service, feed.x, run.train_data, run.distribution,
                               steps_per_epoch=args.steps_per_epoch, resuming=run.progress is not None,
                               force_resume=args.resume == "force", on_error=feed.on_error)
        service.check_reachable(*service.parse_address(feed.data_service))


def preprocessing(run: Run):
    """The model's own preprocessing of its batches (a keras-hub task's preprocessor), which `model.fit` would
    map over the data: kerasfast maps it in the input pipeline instead, once (`kerasfast._compat.keras_fit`).
    None until a builder has made the model (`add_builders_preprocessing`)."""
    import keras

    model = run.prepared.train_model if run.prepared is not None else run.model
    return _compat.hub_preprocessing(model) if isinstance(model, keras.Model) else None


def _read(run: Run, batch_size: int | None) -> None:
    """`run.train_data` and `run.validation`, read from `run.feed` (with the model's own preprocessing)."""
    feed = run.feed
    if isinstance(feed.x, ray_train.RayShard):
        run.train_data = feed.x.prepared(batch_size, run.distribution.cluster.num_workers, shuffle=feed.shuffle,
                                         seed=run.seed)
        preprocess = preprocessing(run)
        if preprocess is not None:
            run.train_data = run.train_data.preprocessed(preprocess)
    else:
        run.train_data = prepare_data(feed.x, feed.y, feed.sample_weight, batch_size=batch_size,
                                      class_weight=feed.class_weight, shuffle=feed.shuffle, seed=run.seed,
                                      repeat=True, on_error=feed.on_error, preprocess=preprocessing(run))
    _validate_with(run, batch_size)


def add_builders_preprocessing(run: Run) -> None:
    """The model a builder made (in the model phase) preprocesses its own batches: the training and validation
    data are read again with that preprocessing, as they would have been for the model itself (in-memory
    arrays are not read from disk again; a deterministic preprocessing is then applied to them once)."""
    if preprocessing(run) is not None:
        with damage_named(run.feed.x, run.feed.validation_data):
            _read(run, run.args.overrides.batch_size)


def _refuse_endless_epochs(x, steps_per_epoch, callbacks) -> None:
    """Refuses a dataset that never ends (`.repeat()`) without `steps_per_epoch` when no callback acts on every
    batch, the only place one could end the run: its first epoch would never end (`model.fit` runs on forever;
    an `EarlyStopping`, which acts at epoch ends, never gets to act)."""
    import tensorflow as tf

    if steps_per_epoch is not None or per_batch_callbacks(callbacks) or not isinstance(x, tf.data.Dataset):
        return
    if int(x.cardinality()) == tf.data.INFINITE_CARDINALITY:
        raise PlanError("x repeats forever (e.g. .repeat() or repeat=True) and steps_per_epoch is not given, so the "
                        "first epoch would never end (no callback acts on every batch to stop it): pass "
                        "steps_per_epoch= (batches per epoch), or a dataset that ends.")


def rebatch(run: Run, batch_size: int) -> None:
    """The same data batched by `batch_size` (found by `batch_size="auto"`)."""
    with damage_named(run.feed.x, run.feed.validation_data):
        run.train_data = run.train_data.rebatched(batch_size)
        _validate_with(run, batch_size)


def _validate_with(run: Run, batch_size: int | None) -> None:
    feed = run.feed
    run.validation = validation_arguments(feed.validation_data, feed.validation_batch_size or batch_size,
                                          feed.validation_steps, feed.validation_freq, run.train_data, feed.on_error,
                                          preprocessing(run))
    # The training data's checks, before any step (Keras would fail only after the first epoch's training).
    check_validation_data(run.validation.get("validation_data"), run.model)


def training_stream(run: Run):
    """`f(batches_done)` giving the training batches: through tf.data service,
    per worker from TFRecords, or the prepared dataset repeated."""
    feed, plan, train_data = run.feed, run.plan, run.train_data
    if feed.data_service is not None:
        return service.service_stream(
            feed.data_service, feed.x, train_data, run.strategy, run.distribution,
            global_batch_size=plan.global_batch_size, steps_per_epoch=plan.steps_per_epoch, shuffle=feed.shuffle,
            on_error=feed.on_error, class_weight=feed.class_weight)
    if isinstance(feed.x, ray_train.RayShard) and run.distribution.name == "multi_worker":
        return feed.x.stream(run.strategy, plan.global_batch_size, shuffle=feed.shuffle, seed=run.seed)
    if train_data.source == "tfrecords" and run.distribution.name == "multi_worker":
        return sharded_tfrecord_stream(os.fspath(feed.x), run.strategy, global_batch_size=plan.global_batch_size,
                                       shuffle=feed.shuffle, seed=run.seed, on_error=feed.on_error)
    passes = train_data.epoch_passes and plan.steps_per_epoch == train_data.facts.steps_per_epoch
    return stream_factory(train_data.dataset, repeat=bool(plan.steps_per_epoch),
                          autotune=train_data.source != "arrays", pass_length=plan.steps_per_epoch if passes else None)


def description(run: Run) -> str:
    """The data's line in the printed plan and the run folder."""
    text = run.train_data.description
    if run.feed.data_service is not None:
        text += f"; {service.describe(run.feed.data_service)}"
    return text
