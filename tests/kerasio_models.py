"""Models copied from keras.io examples and guides, shrunk for CPU, with learnable synthetic data.

Each example has a `build_<name>()` that returns a fresh model compiled exactly as the
keras.io code compiles it, and a `data_<name>()` that returns the keyword arguments for
`fit` (data, batch size, epochs and whatever else the example passes: `validation_split`,
`validation_data`, `class_weight`, `sample_weight`).

The model code follows the Keras 3 versions of the examples; only the sizes are shrunk
(image sides, vocabularies, widths, sequence lengths) so that one `fit` takes a few seconds
on two CPU cores. The real data sets (MNIST, IMDB, Cats vs Dogs, the heart-disease CSV,
the Jena climate CSV, the credit-card fraud CSV, CelebA) are replaced by small numpy data of
the same structure, made with a fixed seed and with targets that depend on the inputs, so
that the loss falls clearly within the few epochs given. Where the code differs from
keras.io for another reason, a comment marked "Changed from keras.io" says why.

`EXAMPLES` lists (name, build_fn, data_fn, expected_metric_names): the names must all appear
in the History that `fit` returns.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers, ops


def _rng(seed):
    return np.random.default_rng(seed)


def _blobs(rng, n, side, channels, centers):
    """`n` smooth images in [0, 1]: one Gaussian blob per image, centred at `centers[i]`."""
    yy, xx = np.mgrid[0:side, 0:side].astype("float32")
    cy, cx = centers[:, 0, None, None], centers[:, 1, None, None]
    sigma = side / 6.0
    images = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * sigma**2))
    images = np.repeat(images[..., None], channels, axis=-1)
    return images.astype("float32")


# ----------------------------------------------------------------------------------------
# 1. Simple MNIST convnet (examples/vision/mnist_convnet.py)
# ----------------------------------------------------------------------------------------

MNIST_SIDE = 16  # keras.io: 28
MNIST_CLASSES = 10


def build_mnist_convnet():
    keras.utils.set_random_seed(1)
    num_classes = MNIST_CLASSES
    input_shape = (MNIST_SIDE, MNIST_SIDE, 1)
    model = keras.Sequential(
        [
            keras.Input(shape=input_shape),
            layers.Conv2D(16, kernel_size=(3, 3), activation="relu"),  # keras.io: 32
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),  # keras.io: 64
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Flatten(),
            layers.Dropout(0.5),
            layers.Dense(num_classes, activation="softmax"),
        ]
    )
    model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
    return model


def data_mnist_convnet():
    """Digit-like images: each class is a fixed random stroke pattern, plus pixel noise."""
    rng = _rng(101)
    n = 640
    templates = (rng.random((MNIST_CLASSES, MNIST_SIDE, MNIST_SIDE, 1)) > 0.7).astype("float32")
    y_train = rng.integers(0, MNIST_CLASSES, size=n)
    x_train = 0.9 * templates[y_train] + 0.3 * rng.random((n, MNIST_SIDE, MNIST_SIDE, 1))
    x_train = np.clip(x_train, 0.0, 1.0).astype("float32")
    # convert class vectors to binary class matrices
    y_train = keras.utils.to_categorical(y_train, MNIST_CLASSES)
    return {"x": x_train, "y": y_train, "batch_size": 32, "epochs": 5, "validation_split": 0.1}


# ----------------------------------------------------------------------------------------
# 2. Text classification with Transformer (examples/nlp/text_classification_with_transformer.py)
# ----------------------------------------------------------------------------------------


class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
        super().__init__()
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential(
            [
                layers.Dense(ff_dim, activation="relu"),
                layers.Dense(embed_dim),
            ]
        )
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output)
        return self.layernorm2(out1 + ffn_output)


class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = ops.shape(x)[-1]
        positions = ops.arange(start=0, stop=maxlen, step=1)
        positions = self.pos_emb(positions)
        x = self.token_emb(x)
        return x + positions


TEXT_VOCAB = 200  # keras.io: 20000
TEXT_MAXLEN = 24  # keras.io: 200


def build_text_transformer(vocab_size=TEXT_VOCAB, maxlen=TEXT_MAXLEN, embed_dim=16, ff_dim=16):
    """The tests' shrunk sizes by default; `build_text_transformer(20000, 200, 32, 32)` is keras.io's model."""
    keras.utils.set_random_seed(2)
    # embed_dim: embedding size for each token (keras.io: 32)
    num_heads = 2  # Number of attention heads
    # ff_dim: hidden layer size in feed forward network inside transformer (keras.io: 32)

    inputs = layers.Input(shape=(maxlen,))
    embedding_layer = TokenAndPositionEmbedding(maxlen, vocab_size, embed_dim)
    x = embedding_layer(inputs)
    transformer_block = TransformerBlock(embed_dim, num_heads, ff_dim)
    x = transformer_block(x)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dropout(0.1)(x)
    x = layers.Dense(20, activation="relu")(x)
    x = layers.Dropout(0.1)(x)
    outputs = layers.Dense(2, activation="softmax")(x)

    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _reviews(rng, n):
    """Padded token sequences; the label says whether "positive" words outnumber "negative" ones."""
    tokens = rng.integers(1, TEXT_VOCAB, size=(n, TEXT_MAXLEN))
    lengths = rng.integers(TEXT_MAXLEN // 2, TEXT_MAXLEN + 1, size=n)
    for i, length in enumerate(lengths):
        tokens[i, : TEXT_MAXLEN - length] = 0  # pad_sequences pads at the front
    positive = (tokens >= 1) & (tokens < 21)
    negative = (tokens >= 21) & (tokens < 41)
    labels = (positive.sum(axis=1) > negative.sum(axis=1)).astype("int64")
    return tokens.astype("int32"), labels


def data_text_transformer():
    rng = _rng(102)
    x_train, y_train = _reviews(rng, 768)
    x_val, y_val = _reviews(rng, 128)
    return {
        "x": x_train,
        "y": y_train,
        "batch_size": 32,
        "epochs": 5,  # keras.io: 2 epochs of 25000 reviews
        "validation_data": (x_val, y_val),
    }


# ----------------------------------------------------------------------------------------
# 3. Image classification from scratch (examples/vision/image_classification_from_scratch.py)
# ----------------------------------------------------------------------------------------

IMAGE_SIZE = (24, 24)  # keras.io: (180, 180)


def data_augmentation(images):
    # Changed from keras.io: the layers are created on each call instead of once at module
    # level, so that two models built from this function do not share layer objects.
    data_augmentation_layers = [
        layers.RandomFlip("horizontal"),
        layers.RandomRotation(0.1),
    ]
    for layer in data_augmentation_layers:
        images = layer(images)
    return images


def make_model(input_shape, num_classes):
    inputs = keras.Input(shape=input_shape)

    # Changed from keras.io: the Keras 3 example applies `data_augmentation` in the tf.data
    # pipeline ("option 2"); here it is part of the model ("option 1" in the same example),
    # so that the model carries its own RandomFlip/RandomRotation layers.
    x = data_augmentation(inputs)

    # Entry block
    x = layers.Rescaling(1.0 / 255)(x)
    x = layers.Conv2D(16, 3, strides=2, padding="same")(x)  # keras.io: 128
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)

    previous_block_activation = x  # Set aside residual

    for size in [16, 32]:  # keras.io: [256, 512, 728]
        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(size, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)

        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(size, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)

        x = layers.MaxPooling2D(3, strides=2, padding="same")(x)

        # Project residual
        residual = layers.Conv2D(size, 1, strides=2, padding="same")(previous_block_activation)
        x = layers.add([x, residual])  # Add back residual
        previous_block_activation = x  # Set aside next residual

    x = layers.SeparableConv2D(64, 3, padding="same")(x)  # keras.io: 1024
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)

    x = layers.GlobalAveragePooling2D()(x)
    if num_classes == 2:
        units = 1
    else:
        units = num_classes

    x = layers.Dropout(0.25)(x)
    # We specify activation=None so as to return logits
    outputs = layers.Dense(units, activation=None)(x)
    return keras.Model(inputs, outputs)


def build_image_classification():
    keras.utils.set_random_seed(3)
    model = make_model(input_shape=IMAGE_SIZE + (3,), num_classes=2)
    model.compile(
        optimizer=keras.optimizers.Adam(3e-4),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=[keras.metrics.BinaryAccuracy(name="acc")],
    )
    return model


def data_image_classification():
    """'Cats' are reddish, 'dogs' bluish: a label that flips and small rotations keep."""
    rng = _rng(103)
    n = 384
    labels = rng.integers(0, 2, size=n)
    images = rng.uniform(0, 160, size=(n,) + IMAGE_SIZE + (3,))
    tint = np.where(labels[:, None] == 0, [90.0, 0.0, 0.0], [0.0, 0.0, 90.0])
    images = np.clip(images + tint[:, None, None, :], 0, 255).astype("float32")
    return {"x": images, "y": labels.astype("float32"), "batch_size": 32, "epochs": 4}


# ----------------------------------------------------------------------------------------
# 4. Structured data classification from scratch
#    (examples/structured_data/structured_data_classification_from_scratch.py)
# ----------------------------------------------------------------------------------------

HEART_INTEGER_FEATURES = ["sex", "cp", "fbs", "restecg", "exang", "ca"]
HEART_NUMERIC_FEATURES = ["age", "trestbps", "chol", "thalach", "oldpeak", "slope"]
THAL_VALUES = np.array(["normal", "fixed", "reversible"], dtype=object)


def _heart_dataframe(rng, n):
    """Columns like the Cleveland heart-disease CSV, in its column order, plus a target.

    Every feature is a (n,) vector, as `dict(dataframe)` gives; `thal` holds Python strings
    (object dtype, as pandas stores them). The target is a fixed logistic rule of a few
    features, so it is learnable.
    """
    frame = {
        "age": rng.normal(54, 9, n).round().astype("float32"),
        "sex": rng.integers(0, 2, n).astype("int64"),
        "cp": rng.integers(0, 5, n).astype("int64"),
        "trestbps": rng.normal(131, 17, n).round().astype("float32"),
        "chol": rng.normal(246, 51, n).round().astype("float32"),
        "fbs": rng.integers(0, 2, n).astype("int64"),
        "restecg": rng.integers(0, 3, n).astype("int64"),
        "thalach": rng.normal(150, 22, n).round().astype("float32"),
        "exang": rng.integers(0, 2, n).astype("int64"),
        "oldpeak": np.abs(rng.normal(1.0, 1.1, n)).round(1).astype("float32"),
        "slope": rng.integers(1, 4, n).astype("float32"),
        "ca": rng.integers(0, 4, n).astype("int64"),
        "thal": THAL_VALUES[rng.integers(0, 3, n)],
    }
    score = (
        1.5 * (frame["age"] - 54) / 9
        - 1.5 * (frame["thalach"] - 150) / 22
        + 1.2 * (frame["oldpeak"] - 1.0)
        + 1.5 * frame["exang"]
        + 0.8 * frame["ca"]
        + 1.5 * (frame["thal"] == "reversible")
        - 1.5 * (frame["cp"] == 0)
        - 1.5
    )
    target = (score + rng.normal(0, 0.5, n) > 0).astype("int64")
    return frame, target


def _heart_train_val():
    rng = _rng(104)
    train = _heart_dataframe(rng, 480)
    val = _heart_dataframe(rng, 120)
    return train, val


def dataframe_to_dataset(frame, labels):
    ds = tf.data.Dataset.from_tensor_slices((dict(frame), labels))
    ds = ds.shuffle(buffer_size=len(labels), seed=1337)
    return ds


def encode_numerical_feature(feature, name, dataset):
    # Create a Normalization layer for our feature
    normalizer = layers.Normalization()

    # Prepare a Dataset that only yields our feature
    feature_ds = dataset.map(lambda x, y: x[name])
    feature_ds = feature_ds.map(lambda x: tf.expand_dims(x, -1))

    # Learn the statistics of the data
    normalizer.adapt(feature_ds)

    # Normalize the input feature
    encoded_feature = normalizer(feature)
    return encoded_feature


def encode_categorical_feature(feature, name, dataset, is_string):
    lookup_class = layers.StringLookup if is_string else layers.IntegerLookup
    # Create a lookup layer which will turn strings into integer indices.
    # Changed from keras.io: the example uses `output_mode="binary"` (in Keras 3 a legacy
    # alias of "multi_hot", which for one value per sample is a one-hot vector). Here the
    # lookup returns integer indices and `CategoryEncoding` one-hot encodes them: the same
    # encoding, with the CategoryEncoding layer of the Keras 3 preprocessing examples.
    lookup = lookup_class(output_mode="int")

    # Prepare a Dataset that only yields our feature
    feature_ds = dataset.map(lambda x, y: x[name])
    feature_ds = feature_ds.map(lambda x: tf.expand_dims(x, -1))

    # Learn the set of possible string values and assign them a fixed integer index
    lookup.adapt(feature_ds)

    # Turn the string input into integer indices, then one-hot encode them
    encoded_feature = lookup(feature)
    encoder = layers.CategoryEncoding(num_tokens=lookup.vocabulary_size(), output_mode="one_hot")
    return encoder(encoded_feature)


def build_structured_data():
    keras.utils.set_random_seed(4)
    (train_frame, train_target), _ = _heart_train_val()
    train_ds = dataframe_to_dataset(train_frame, train_target).batch(32)

    # Categorical features encoded as integers
    sex = keras.Input(shape=(1,), name="sex", dtype="int64")
    cp = keras.Input(shape=(1,), name="cp", dtype="int64")
    fbs = keras.Input(shape=(1,), name="fbs", dtype="int64")
    restecg = keras.Input(shape=(1,), name="restecg", dtype="int64")
    exang = keras.Input(shape=(1,), name="exang", dtype="int64")
    ca = keras.Input(shape=(1,), name="ca", dtype="int64")

    # Categorical feature encoded as string
    thal = keras.Input(shape=(1,), name="thal", dtype="string")

    # Numerical features
    age = keras.Input(shape=(1,), name="age")
    trestbps = keras.Input(shape=(1,), name="trestbps")
    chol = keras.Input(shape=(1,), name="chol")
    thalach = keras.Input(shape=(1,), name="thalach")
    oldpeak = keras.Input(shape=(1,), name="oldpeak")
    slope = keras.Input(shape=(1,), name="slope")

    all_inputs = [
        sex,
        cp,
        fbs,
        restecg,
        exang,
        ca,
        thal,
        age,
        trestbps,
        chol,
        thalach,
        oldpeak,
        slope,
    ]

    # Integer categorical features
    sex_encoded = encode_categorical_feature(sex, "sex", train_ds, False)
    cp_encoded = encode_categorical_feature(cp, "cp", train_ds, False)
    fbs_encoded = encode_categorical_feature(fbs, "fbs", train_ds, False)
    restecg_encoded = encode_categorical_feature(restecg, "restecg", train_ds, False)
    exang_encoded = encode_categorical_feature(exang, "exang", train_ds, False)
    ca_encoded = encode_categorical_feature(ca, "ca", train_ds, False)

    # String categorical features
    thal_encoded = encode_categorical_feature(thal, "thal", train_ds, True)

    # Numerical features
    age_encoded = encode_numerical_feature(age, "age", train_ds)
    trestbps_encoded = encode_numerical_feature(trestbps, "trestbps", train_ds)
    chol_encoded = encode_numerical_feature(chol, "chol", train_ds)
    thalach_encoded = encode_numerical_feature(thalach, "thalach", train_ds)
    oldpeak_encoded = encode_numerical_feature(oldpeak, "oldpeak", train_ds)
    slope_encoded = encode_numerical_feature(slope, "slope", train_ds)

    all_features = layers.concatenate(
        [
            sex_encoded,
            cp_encoded,
            fbs_encoded,
            restecg_encoded,
            exang_encoded,
            slope_encoded,
            ca_encoded,
            thal_encoded,
            age_encoded,
            trestbps_encoded,
            chol_encoded,
            thalach_encoded,
            oldpeak_encoded,
        ]
    )
    x = layers.Dense(32, activation="relu")(all_features)
    x = layers.Dropout(0.5)(x)
    output = layers.Dense(1, activation="sigmoid")(x)
    model = keras.Model(all_inputs, output)
    model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
    return model


def data_structured_data():
    # Changed from keras.io: the example fits on a tf.data.Dataset made from the dataframe;
    # here fit gets the same columns as a dict of numpy (n,) vectors (one per Input of shape
    # (1,), in the CSV's column order, strings as an object array), the in-memory form that
    # `model.fit` accepts directly.
    (train_frame, train_target), (val_frame, val_target) = _heart_train_val()
    return {
        "x": train_frame,
        "y": train_target,
        "batch_size": 32,
        "epochs": 8,  # keras.io: 50 epochs of 242 rows
        "validation_data": (val_frame, val_target),
    }


# ----------------------------------------------------------------------------------------
# 5. Multi-input, multi-output "ticket" model (guides/functional_api.py)
# ----------------------------------------------------------------------------------------

NUM_TAGS = 12  # Number of unique issue tags
NUM_WORDS = 500  # Size of vocabulary obtained when preprocessing text data (keras.io: 10000)
NUM_DEPARTMENTS = 4  # Number of departments for predictions


def build_ticket_model():
    keras.utils.set_random_seed(5)
    num_tags, num_words, num_departments = NUM_TAGS, NUM_WORDS, NUM_DEPARTMENTS

    title_input = keras.Input(shape=(None,), name="title")  # Variable-length sequence of ints
    body_input = keras.Input(shape=(None,), name="body")  # Variable-length sequence of ints
    tags_input = keras.Input(shape=(num_tags,), name="tags")  # Binary vectors of size `num_tags`

    # Embed each word in the title into a 16-dimensional vector (keras.io: 64)
    title_features = layers.Embedding(num_words, 16)(title_input)
    # Embed each word in the text into a 16-dimensional vector (keras.io: 64)
    body_features = layers.Embedding(num_words, 16)(body_input)

    # Reduce sequence of embedded words in the title into a single 16-dimensional vector
    # (keras.io: 128)
    title_features = layers.LSTM(16)(title_features)
    # Reduce sequence of embedded words in the body into a single 8-dimensional vector
    # (keras.io: 32)
    body_features = layers.LSTM(8)(body_features)

    # Merge all available features into a single large vector via concatenation
    x = layers.concatenate([title_features, body_features, tags_input])

    # Stick a logistic regression for priority prediction on top of the features
    priority_pred = layers.Dense(1, name="priority")(x)
    # Stick a department classifier on top of the features
    department_pred = layers.Dense(num_departments, name="department")(x)

    # Instantiate an end-to-end model predicting both priority and department
    model = keras.Model(
        inputs=[title_input, body_input, tags_input],
        outputs=[priority_pred, department_pred],
    )
    model.compile(
        optimizer=keras.optimizers.RMSprop(1e-3),
        loss={
            "priority": keras.losses.BinaryCrossentropy(from_logits=True),
            "department": keras.losses.CategoricalCrossentropy(from_logits=True),
        },
        loss_weights={"priority": 1.0, "department": 0.2},
    )
    return model


def data_ticket_model():
    # Changed from keras.io: the guide's targets are random ("Dummy target data"); here
    # they follow fixed rules of the tags and the title, so that the loss can fall.
    rng = _rng(105)
    n = 512  # keras.io: 1280
    title_data = rng.integers(NUM_WORDS, size=(n, 10))
    body_data = rng.integers(NUM_WORDS, size=(n, 20))  # keras.io: 100 words
    tags_data = rng.integers(2, size=(n, NUM_TAGS)).astype("float32")

    w_priority = rng.normal(size=NUM_TAGS)
    priority_targets = ((tags_data - 0.5) @ w_priority > 0).astype("float32")[:, None]
    w_department = rng.normal(size=(NUM_TAGS, NUM_DEPARTMENTS))
    dept_targets = keras.utils.to_categorical(
        np.argmax(tags_data @ w_department, axis=1), NUM_DEPARTMENTS
    )
    # Dicts keyed by input and output name, deliberately in an order that is neither the
    # model's input order (title, body, tags) nor sorted.
    return {
        "x": {"tags": tags_data, "title": title_data, "body": body_data},
        "y": {"priority": priority_targets, "department": dept_targets},
        "epochs": 8,  # keras.io: 2
        "batch_size": 32,
    }


# ----------------------------------------------------------------------------------------
# 6. Variational AutoEncoder (examples/generative/vae.py)
# ----------------------------------------------------------------------------------------

VAE_SIDE = 16  # keras.io: 28


class Sampling(layers.Layer):
    """Uses (z_mean, z_log_var) to sample z, the vector encoding a digit."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs):
        z_mean, z_log_var = inputs
        batch = ops.shape(z_mean)[0]
        dim = ops.shape(z_mean)[1]
        epsilon = keras.random.normal(shape=(batch, dim), seed=self.seed_generator)
        return z_mean + ops.exp(0.5 * z_log_var) * epsilon


class VAE(keras.Model):
    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.decoder = decoder
        self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
        self.reconstruction_loss_tracker = keras.metrics.Mean(name="reconstruction_loss")
        self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

    @property
    def metrics(self):
        return [
            self.total_loss_tracker,
            self.reconstruction_loss_tracker,
            self.kl_loss_tracker,
        ]

    def train_step(self, data):
        with tf.GradientTape() as tape:
            z_mean, z_log_var, z = self.encoder(data)
            reconstruction = self.decoder(z)
            reconstruction_loss = ops.mean(
                ops.sum(
                    keras.losses.binary_crossentropy(data, reconstruction),
                    axis=(1, 2),
                )
            )
            kl_loss = -0.5 * (1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var))
            kl_loss = ops.mean(ops.sum(kl_loss, axis=1))
            total_loss = reconstruction_loss + kl_loss
        grads = tape.gradient(total_loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights, strict=True))
        self.total_loss_tracker.update_state(total_loss)
        self.reconstruction_loss_tracker.update_state(reconstruction_loss)
        self.kl_loss_tracker.update_state(kl_loss)
        return {
            "loss": self.total_loss_tracker.result(),
            "reconstruction_loss": self.reconstruction_loss_tracker.result(),
            "kl_loss": self.kl_loss_tracker.result(),
        }


def build_vae():
    keras.utils.set_random_seed(6)
    latent_dim = 2
    quarter = VAE_SIDE // 4

    encoder_inputs = keras.Input(shape=(VAE_SIDE, VAE_SIDE, 1))
    x = layers.Conv2D(8, 3, activation="relu", strides=2, padding="same")(encoder_inputs)  # keras.io: 32
    x = layers.Conv2D(16, 3, activation="relu", strides=2, padding="same")(x)  # keras.io: 64
    x = layers.Flatten()(x)
    x = layers.Dense(16, activation="relu")(x)
    z_mean = layers.Dense(latent_dim, name="z_mean")(x)
    z_log_var = layers.Dense(latent_dim, name="z_log_var")(x)
    z = Sampling()([z_mean, z_log_var])
    encoder = keras.Model(encoder_inputs, [z_mean, z_log_var, z], name="encoder")

    latent_inputs = keras.Input(shape=(latent_dim,))
    x = layers.Dense(quarter * quarter * 16, activation="relu")(latent_inputs)
    x = layers.Reshape((quarter, quarter, 16))(x)
    x = layers.Conv2DTranspose(16, 3, activation="relu", strides=2, padding="same")(x)  # keras.io: 64
    x = layers.Conv2DTranspose(8, 3, activation="relu", strides=2, padding="same")(x)  # keras.io: 32
    decoder_outputs = layers.Conv2DTranspose(1, 3, activation="sigmoid", padding="same")(x)
    decoder = keras.Model(latent_inputs, decoder_outputs, name="decoder")

    vae = VAE(encoder, decoder)
    vae.compile(optimizer=keras.optimizers.Adam())
    return vae


def data_vae():
    """Digit-like images in [0, 1]: a blob at a random place (a 2-D latent space)."""
    rng = _rng(106)
    n = 512
    centers = rng.uniform(3, VAE_SIDE - 4, size=(n, 2))
    mnist_digits = _blobs(rng, n, VAE_SIDE, 1, centers)
    return {"x": mnist_digits, "epochs": 4, "batch_size": 32}  # keras.io: 30 epochs, batch 128


# ----------------------------------------------------------------------------------------
# 7. DCGAN overriding train_step (examples/generative/dcgan_overriding_train_step.py)
# ----------------------------------------------------------------------------------------

GAN_SIDE = 16  # keras.io: 64
GAN_LATENT_DIM = 16  # keras.io: 128


class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.seed_generator = keras.random.SeedGenerator(1337)

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn
        self.d_loss_metric = keras.metrics.Mean(name="d_loss")
        self.g_loss_metric = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_metric, self.g_loss_metric]

    def train_step(self, real_images):
        # Sample random points in the latent space
        batch_size = ops.shape(real_images)[0]
        random_latent_vectors = keras.random.normal(
            shape=(batch_size, self.latent_dim), seed=self.seed_generator
        )

        # Decode them to fake images
        generated_images = self.generator(random_latent_vectors)

        # Combine them with real images
        combined_images = ops.concatenate([generated_images, real_images], axis=0)

        # Assemble labels discriminating real from fake images
        labels = ops.concatenate([ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))], axis=0)
        # Add random noise to the labels - important trick!
        labels += 0.05 * tf.random.uniform(tf.shape(labels))

        # Train the discriminator
        with tf.GradientTape() as tape:
            predictions = self.discriminator(combined_images)
            d_loss = self.loss_fn(labels, predictions)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights, strict=True))

        # Sample random points in the latent space
        random_latent_vectors = keras.random.normal(
            shape=(batch_size, self.latent_dim), seed=self.seed_generator
        )

        # Assemble labels that say "all real images"
        misleading_labels = ops.zeros((batch_size, 1))

        # Train the generator (note that we should *not* update the weights
        # of the discriminator)!
        with tf.GradientTape() as tape:
            predictions = self.discriminator(self.generator(random_latent_vectors))
            g_loss = self.loss_fn(misleading_labels, predictions)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights, strict=True))

        # Update metrics
        self.d_loss_metric.update_state(d_loss)
        self.g_loss_metric.update_state(g_loss)
        return {
            "d_loss": self.d_loss_metric.result(),
            "g_loss": self.g_loss_metric.result(),
        }


def build_dcgan():
    keras.utils.set_random_seed(7)
    discriminator = keras.Sequential(
        [
            keras.Input(shape=(GAN_SIDE, GAN_SIDE, 3)),
            layers.Conv2D(8, kernel_size=4, strides=2, padding="same"),  # keras.io: 64
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(16, kernel_size=4, strides=2, padding="same"),  # keras.io: 128
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(16, kernel_size=4, strides=2, padding="same"),  # keras.io: 128
            layers.LeakyReLU(negative_slope=0.2),
            layers.Flatten(),
            layers.Dropout(0.2),
            layers.Dense(1, activation="sigmoid"),
        ],
        name="discriminator",
    )

    latent_dim = GAN_LATENT_DIM
    start = GAN_SIDE // 8
    generator = keras.Sequential(
        [
            keras.Input(shape=(latent_dim,)),
            layers.Dense(start * start * 16),  # keras.io: 8 * 8 * 128
            layers.Reshape((start, start, 16)),
            layers.Conv2DTranspose(16, kernel_size=4, strides=2, padding="same"),  # keras.io: 128
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2DTranspose(16, kernel_size=4, strides=2, padding="same"),  # keras.io: 256
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2DTranspose(32, kernel_size=4, strides=2, padding="same"),  # keras.io: 512
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(3, kernel_size=5, padding="same", activation="sigmoid"),
        ],
        name="generator",
    )

    gan = GAN(discriminator=discriminator, generator=generator, latent_dim=latent_dim)
    gan.compile(
        d_optimizer=keras.optimizers.Adam(learning_rate=0.0001),
        g_optimizer=keras.optimizers.Adam(learning_rate=0.0001),
        loss_fn=keras.losses.BinaryCrossentropy(),
    )
    return gan


def data_dcgan():
    """'Faces': a bright blob near the centre on a darker background, as 0-255 pixels."""
    rng = _rng(107)
    n = 256
    centers = GAN_SIDE / 2 + rng.normal(0, 1.0, size=(n, 2))
    images = 255.0 * (0.2 + 0.6 * _blobs(rng, n, GAN_SIDE, 3, centers))
    # keras.io: image_dataset_from_directory(..., label_mode=None, batch_size=32), then /255
    dataset = tf.data.Dataset.from_tensor_slices(images.astype("float32")).batch(32)
    dataset = dataset.map(lambda x: x / 255.0)
    return {"x": dataset, "epochs": 2}  # keras.io: 1 epoch ("in practice, use ~100")


# ----------------------------------------------------------------------------------------
# 8. Timeseries forecasting for weather prediction
#    (examples/timeseries/timeseries_weather_forecasting.py)
# ----------------------------------------------------------------------------------------


def _climate_features(rng, n):
    """Seven weather-like series (pressure, temperature, ...), with daily/annual cycles."""
    t = np.arange(n, dtype="float64")
    day = 2 * np.pi * t / 24.0
    season = 2 * np.pi * t / 900.0
    temperature = 10 * np.sin(season) + 4 * np.sin(day) + rng.normal(0, 0.5, n)
    pressure = 1000 - 0.8 * temperature + rng.normal(0, 1.0, n)
    saturation = 6 + 0.4 * temperature + rng.normal(0, 0.2, n)
    vapor = 0.7 * saturation + rng.normal(0, 0.2, n)
    humidity = 70 - 1.5 * temperature + rng.normal(0, 3.0, n)
    density = 1250 - 4 * temperature + rng.normal(0, 2.0, n)
    wind = np.abs(2 + np.cos(day) + rng.normal(0, 0.5, n))
    return np.stack([pressure, temperature, saturation, vapor, humidity, density, wind], axis=1)


def normalize(data, train_split):
    data_mean = data[:train_split].mean(axis=0)
    data_std = data[:train_split].std(axis=0)
    return (data - data_mean) / data_std


TS_SPLIT_FRACTION = 0.8
TS_STEP = 2  # keras.io: 6 (one sample per hour)
TS_PAST = 48  # keras.io: 720
TS_FUTURE = 6  # keras.io: 72
TS_BATCH_SIZE = 64  # keras.io: 256


def build_timeseries_lstm():
    keras.utils.set_random_seed(8)
    learning_rate = 0.001
    sequence_length = int(TS_PAST / TS_STEP)
    inputs = keras.layers.Input(shape=(sequence_length, 7))
    lstm_out = keras.layers.LSTM(16)(inputs)  # keras.io: 32
    outputs = keras.layers.Dense(1)(lstm_out)

    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=learning_rate), loss="mse")
    return model


def data_timeseries_lstm():
    rng = _rng(108)
    raw = _climate_features(rng, 2400)
    train_split = int(TS_SPLIT_FRACTION * int(raw.shape[0]))
    features = normalize(raw, train_split).astype("float32")
    train_data = features[0 : train_split - 1]
    val_data = features[train_split:]

    start = TS_PAST + TS_FUTURE
    end = start + train_split
    x_train = train_data[:, :7]
    y_train = features[start:end, 1:2]  # the temperature, TS_FUTURE samples after the window
    sequence_length = int(TS_PAST / TS_STEP)

    dataset_train = keras.utils.timeseries_dataset_from_array(
        x_train,
        y_train,
        sequence_length=sequence_length,
        sampling_rate=TS_STEP,
        batch_size=TS_BATCH_SIZE,
    )

    x_end = len(val_data) - TS_PAST - TS_FUTURE
    label_start = train_split + TS_PAST + TS_FUTURE
    x_val = val_data[:x_end, :7]
    y_val = features[label_start:, 1:2]

    dataset_val = keras.utils.timeseries_dataset_from_array(
        x_val,
        y_val,
        sequence_length=sequence_length,
        sampling_rate=TS_STEP,
        batch_size=TS_BATCH_SIZE,
    )
    return {"x": dataset_train, "epochs": 3, "validation_data": dataset_val}  # keras.io: 10


# ----------------------------------------------------------------------------------------
# 9. Imbalanced classification: credit card fraud detection
#    (examples/structured_data/imbalanced_classification.py)
# ----------------------------------------------------------------------------------------

FRAUD_FEATURES = 30


def build_imbalanced():
    keras.utils.set_random_seed(9)
    model = keras.Sequential(
        [
            keras.Input(shape=(FRAUD_FEATURES,)),
            keras.layers.Dense(32, activation="relu"),  # keras.io: 256
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dropout(0.3),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dropout(0.3),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    metrics = [
        keras.metrics.FalseNegatives(name="fn"),
        keras.metrics.FalsePositives(name="fp"),
        keras.metrics.TrueNegatives(name="tn"),
        keras.metrics.TruePositives(name="tp"),
        keras.metrics.Precision(name="precision"),
        keras.metrics.Recall(name="recall"),
    ]
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy", metrics=metrics)
    return model


def data_imbalanced():
    rng = _rng(109)
    n = 1500
    features = rng.normal(size=(n, FRAUD_FEATURES)).astype("float32")
    score = features @ rng.normal(size=FRAUD_FEATURES)
    targets = (score > np.quantile(score, 0.95)).astype("uint8")[:, None]  # 5% fraud

    num_val_samples = int(len(features) * 0.2)
    train_features = features[:-num_val_samples]
    train_targets = targets[:-num_val_samples]
    val_features = features[-num_val_samples:]
    val_targets = targets[-num_val_samples:]

    counts = np.bincount(train_targets[:, 0])
    weight_for_0 = 1.0 / counts[0]
    weight_for_1 = 1.0 / counts[1]

    mean = np.mean(train_features, axis=0)
    train_features -= mean
    val_features -= mean
    std = np.std(train_features, axis=0)
    train_features /= std
    val_features /= std

    class_weight = {0: weight_for_0, 1: weight_for_1}
    return {
        "x": train_features,
        "y": train_targets,
        "batch_size": 128,  # keras.io: 2048 of ~227k rows
        "epochs": 6,  # keras.io: 30
        "validation_data": (val_features, val_targets),
        "class_weight": class_weight,
    }


# ----------------------------------------------------------------------------------------
# 10-13. Training & evaluation with the built-in methods (guides/training_with_built_in_methods.py)
# ----------------------------------------------------------------------------------------

GUIDE_INPUTS = 64  # keras.io: 784 (flattened MNIST)


def get_uncompiled_model():
    inputs = keras.Input(shape=(GUIDE_INPUTS,), name="digits")
    x = layers.Dense(64, activation="relu", name="dense_1")(inputs)
    x = layers.Dense(64, activation="relu", name="dense_2")(x)
    outputs = layers.Dense(10, activation="softmax", name="predictions")(x)
    model = keras.Model(inputs=inputs, outputs=outputs)
    return model


def get_compiled_model():
    model = get_uncompiled_model()
    model.compile(
        optimizer="rmsprop",
        loss="sparse_categorical_crossentropy",
        metrics=["sparse_categorical_accuracy"],
    )
    return model


def _guide_digits(seed, n):
    """Flattened 'digits' in [0, 1]: a fixed random pattern per class, plus pixel noise."""
    rng = _rng(seed)
    templates = _rng(110).random((10, GUIDE_INPUTS))
    y = rng.integers(0, 10, size=n)
    x = (0.5 * templates[y] + 0.5 * rng.random((n, GUIDE_INPUTS))).astype("float32")
    return x, y.astype("float32")


class CustomMSE(keras.losses.Loss):
    def __init__(self, regularization_factor=0.1, name="custom_mse"):
        super().__init__(name=name)
        self.regularization_factor = regularization_factor

    def call(self, y_true, y_pred):
        mse = ops.mean(ops.square(y_true - y_pred), axis=-1)
        reg = ops.mean(ops.square(0.5 - y_pred), axis=-1)
        return mse + reg * self.regularization_factor


def build_custom_loss():
    keras.utils.set_random_seed(10)
    model = get_uncompiled_model()
    model.compile(optimizer=keras.optimizers.Adam(), loss=CustomMSE())
    return model


def data_custom_loss():
    x_train, y_train = _guide_digits(111, 1024)
    y_train_one_hot = keras.utils.to_categorical(y_train, 10)  # keras.io: ops.one_hot
    return {"x": x_train, "y": y_train_one_hot, "batch_size": 64, "epochs": 6}  # keras.io: 1


class CategoricalTruePositives(keras.metrics.Metric):
    def __init__(self, name="categorical_true_positives", **kwargs):
        super().__init__(name=name, **kwargs)
        self.true_positives = self.add_variable(shape=(), name="ctp", initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_pred = ops.reshape(ops.argmax(y_pred, axis=1), (-1, 1))
        values = ops.cast(y_true, "int32") == ops.cast(y_pred, "int32")
        values = ops.cast(values, "float32")
        if sample_weight is not None:
            sample_weight = ops.cast(sample_weight, "float32")
            values = ops.multiply(values, sample_weight)
        self.true_positives.assign_add(ops.sum(values))

    def result(self):
        return self.true_positives

    def reset_state(self):
        # The state of the metric will be reset at the start of each epoch.
        self.true_positives.assign(0)


class ActivityRegularizationLayer(layers.Layer):
    def call(self, inputs):
        self.add_loss(ops.sum(inputs) * 0.1)
        return inputs  # Pass-through layer.


def build_custom_metric_add_loss():
    # Changed from keras.io: the guide shows CategoricalTruePositives on the plain model and
    # ActivityRegularizationLayer on a second one; here one model carries both (the layer
    # inside, the metric in compile), with the compile arguments of the guide's
    # ActivityRegularizationLayer model.
    keras.utils.set_random_seed(11)
    inputs = keras.Input(shape=(GUIDE_INPUTS,), name="digits")
    x = layers.Dense(64, activation="relu", name="dense_1")(inputs)

    # Insert activity regularization as a layer
    x = ActivityRegularizationLayer()(x)

    x = layers.Dense(64, activation="relu", name="dense_2")(x)
    outputs = layers.Dense(10, name="predictions")(x)

    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(
        optimizer=keras.optimizers.RMSprop(learning_rate=1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[CategoricalTruePositives()],
    )
    return model


def data_custom_metric_add_loss():
    x_train, y_train = _guide_digits(112, 1024)
    return {"x": x_train, "y": y_train, "batch_size": 64, "epochs": 3}


def build_sample_weight():
    keras.utils.set_random_seed(12)
    return get_compiled_model()


def data_sample_weight():
    x_train, y_train = _guide_digits(113, 1024)
    sample_weight = np.ones(shape=(len(y_train),))
    sample_weight[y_train == 5] = 2.0
    return {
        "x": x_train,
        "y": y_train,
        "sample_weight": sample_weight,
        "batch_size": 64,
        "epochs": 4,  # keras.io: 1
    }


class ExamplePyDataset(keras.utils.PyDataset):
    def __init__(self, x, y, batch_size, **kwargs):
        super().__init__(**kwargs)
        self.x = x
        self.y = y
        self.batch_size = batch_size

    def __len__(self):
        return int(np.ceil(len(self.x) / float(self.batch_size)))

    def __getitem__(self, idx):
        batch_x = self.x[idx * self.batch_size : (idx + 1) * self.batch_size]
        batch_y = self.y[idx * self.batch_size : (idx + 1) * self.batch_size]
        return batch_x, batch_y


def build_pydataset():
    keras.utils.set_random_seed(13)
    return get_compiled_model()


def data_pydataset():
    x_train, y_train = _guide_digits(114, 1024)
    x_val, y_val = _guide_digits(115, 256)
    train_py_dataset = ExamplePyDataset(x_train, y_train, batch_size=32)
    val_py_dataset = ExamplePyDataset(x_val, y_val, batch_size=32)
    # As in the guide, fit also gets batch_size=64, which a PyDataset (already batched)
    # makes irrelevant.
    return {
        "x": train_py_dataset,
        "batch_size": 64,
        "validation_data": val_py_dataset,
        "epochs": 3,  # keras.io: 1
    }


# ----------------------------------------------------------------------------------------
# 14. Knowledge distillation (examples/vision/knowledge_distillation.py)
# ----------------------------------------------------------------------------------------


class Distiller(keras.Model):
    def __init__(self, student, teacher):
        super().__init__()
        self.teacher = teacher
        self.student = student

    def compile(
        self,
        optimizer,
        metrics,
        student_loss_fn,
        distillation_loss_fn,
        alpha=0.1,
        temperature=3,
    ):
        super().compile(optimizer=optimizer, metrics=metrics)
        self.student_loss_fn = student_loss_fn
        self.distillation_loss_fn = distillation_loss_fn
        self.alpha = alpha
        self.temperature = temperature

    # keras.io's override takes no `training` argument: Keras calls it without one.
    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, allow_empty=False
    ):
        teacher_pred = self.teacher(x, training=False)
        student_loss = self.student_loss_fn(y, y_pred)

        distillation_loss = self.distillation_loss_fn(
            ops.softmax(teacher_pred / self.temperature, axis=1),
            ops.softmax(y_pred / self.temperature, axis=1),
        ) * (self.temperature**2)

        loss = self.alpha * student_loss + (1 - self.alpha) * distillation_loss
        return loss

    def call(self, x):
        return self.student(x)


def _distillation_data():
    data = data_mnist_convnet()
    return data["x"], np.argmax(data["y"], axis=1)


def build_distiller():
    keras.utils.set_random_seed(14)
    # Create the teacher
    teacher = keras.Sequential(
        [
            keras.Input(shape=(MNIST_SIDE, MNIST_SIDE, 1)),
            layers.Conv2D(32, (3, 3), strides=(2, 2), padding="same"),  # keras.io: 256
            layers.LeakyReLU(negative_slope=0.2),
            layers.MaxPooling2D(pool_size=(2, 2), strides=(1, 1), padding="same"),
            layers.Conv2D(64, (3, 3), strides=(2, 2), padding="same"),  # keras.io: 512
            layers.Flatten(),
            layers.Dense(10),
        ],
        name="teacher",
    )
    # Create the student
    student = keras.Sequential(
        [
            keras.Input(shape=(MNIST_SIDE, MNIST_SIDE, 1)),
            layers.Conv2D(4, (3, 3), strides=(2, 2), padding="same"),  # keras.io: 16
            layers.LeakyReLU(negative_slope=0.2),
            layers.MaxPooling2D(pool_size=(2, 2), strides=(1, 1), padding="same"),
            layers.Conv2D(8, (3, 3), strides=(2, 2), padding="same"),  # keras.io: 32
            layers.Flatten(),
            layers.Dense(10),
        ],
        name="student",
    )
    # Train teacher as usual
    teacher.compile(
        optimizer=keras.optimizers.Adam(),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )
    x_train, y_train = _distillation_data()
    teacher.fit(x_train, y_train, epochs=2, verbose=0)  # keras.io: 5

    # Initialize and compile distiller
    distiller = Distiller(student=student, teacher=teacher)
    distiller.compile(
        optimizer=keras.optimizers.Adam(),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
        student_loss_fn=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        distillation_loss_fn=keras.losses.KLDivergence(),
        alpha=0.1,
        temperature=10,
    )
    return distiller


def data_distiller():
    x_train, y_train = _distillation_data()
    return {"x": x_train, "y": y_train, "batch_size": 32, "epochs": 3}


# ----------------------------------------------------------------------------------------
# 15. A warmup cosine schedule of the user's own, without get_config
#     (examples/vision/shiftvit.py's WarmUpCosine and AdamW, on the guide's MLP)
# ----------------------------------------------------------------------------------------


class WarmUpCosine(keras.optimizers.schedules.LearningRateSchedule):
    """A LearningRateSchedule that uses a warmup cosine decay schedule."""

    # Changed from keras.io: keras.ops instead of tf ops, and the comments and the
    # ValueErrors' long messages shortened.

    def __init__(self, lr_start, lr_max, warmup_steps, total_steps):
        super().__init__()
        self.lr_start = lr_start
        self.lr_max = lr_max
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.pi = np.pi

    def __call__(self, step):
        if self.total_steps < self.warmup_steps:
            raise ValueError("Total_steps must be larger or equal to warmup_steps.")
        step = ops.cast(step, "float32")
        cos_annealed_lr = ops.cos(
            self.pi
            * (step - self.warmup_steps)
            / float(self.total_steps - self.warmup_steps)
        )
        learning_rate = 0.5 * self.lr_max * (1 + cos_annealed_lr)
        if self.warmup_steps > 0:
            if self.lr_max < self.lr_start:
                raise ValueError("lr_start must be smaller or equal to lr_max.")
            slope = (self.lr_max - self.lr_start) / self.warmup_steps
            warmup_rate = slope * step + self.lr_start
            learning_rate = ops.where(step < self.warmup_steps, warmup_rate, learning_rate)
        return ops.where(step > self.total_steps, 0.0, learning_rate)


def build_warmup_cosine():
    keras.utils.set_random_seed(15)
    model = get_uncompiled_model()
    total_steps = 4 * 1024 // 64
    warmup_steps = int(total_steps * 0.15)
    scheduled_lrs = WarmUpCosine(lr_start=1e-5, lr_max=2e-3, warmup_steps=warmup_steps, total_steps=total_steps)
    model.compile(
        optimizer=keras.optimizers.AdamW(learning_rate=scheduled_lrs, weight_decay=0.0001),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )
    return model


def data_warmup_cosine():
    x_train, y_train = _guide_digits(116, 1024)
    return {"x": x_train, "y": y_train, "batch_size": 64, "epochs": 4}


# ----------------------------------------------------------------------------------------

EXAMPLES = [
    ("mnist_convnet", build_mnist_convnet, data_mnist_convnet,
     ["loss", "accuracy", "val_loss", "val_accuracy"]),
    ("text_transformer", build_text_transformer, data_text_transformer,
     ["loss", "accuracy", "val_loss", "val_accuracy"]),
    ("image_classification", build_image_classification, data_image_classification,
     ["loss", "acc"]),
    ("structured_data", build_structured_data, data_structured_data,
     ["loss", "accuracy", "val_loss", "val_accuracy"]),
    ("ticket_model", build_ticket_model, data_ticket_model,
     ["loss", "priority_loss", "department_loss"]),
    ("vae", build_vae, data_vae,
     ["loss", "reconstruction_loss", "kl_loss"]),
    ("dcgan", build_dcgan, data_dcgan,
     ["d_loss", "g_loss"]),
    ("timeseries_lstm", build_timeseries_lstm, data_timeseries_lstm,
     ["loss", "val_loss"]),
    # "fn" is compiled but not required: a model that has learned the rule can have no
    # false negatives in a whole epoch.
    ("imbalanced", build_imbalanced, data_imbalanced,
     ["loss", "fp", "tn", "tp", "precision", "recall", "val_loss"]),
    ("custom_loss", build_custom_loss, data_custom_loss,
     ["loss"]),
    ("custom_metric_add_loss", build_custom_metric_add_loss, data_custom_metric_add_loss,
     ["loss", "categorical_true_positives"]),
    ("sample_weight", build_sample_weight, data_sample_weight,
     ["loss", "sparse_categorical_accuracy"]),
    ("pydataset", build_pydataset, data_pydataset,
     ["loss", "sparse_categorical_accuracy", "val_loss", "val_sparse_categorical_accuracy"]),
    ("distiller", build_distiller, data_distiller,
     ["loss", "sparse_categorical_accuracy"]),
    ("warmup_cosine", build_warmup_cosine, data_warmup_cosine,
     ["loss", "sparse_categorical_accuracy"]),
]
