/* Training and test data of the MNIST example: record shards (hora-records convert-idx) read
 * through hora's sharded, shuffling reader, or MNIST-format IDX files, converted once per node
 * into record shards in a cache directory so that both inputs take the same path. */
#ifndef MNIST_DATA_H
#define MNIST_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "hora.h"

typedef struct {
  char train_pattern[4096]; /* glob of the training shards */
  char test_pattern[4096];  /* glob of the test shards */
  uint64_t train_records;   /* this rank's shard of the training set, records per epoch */
  uint64_t test_records;    /* all test records */
} mnist_data_t;

/* Finds the data under `dir`: train-*.tfrecord / test-*.tfrecord shards, else IDX files
 * (train-images*, train-labels*, t10k-images*, t10k-labels*, gzip or raw), which local rank 0 of
 * each node converts into record shards under cache_dir (reused when complete) while the other
 * ranks wait. Counts this rank's training shard with the reader's sharding rule (docs/data.md).
 * Collective. On error prints nothing; hora_last_error()-style detail goes to `err`. */
hora_result_t mnist_data_open(hora_ctx_t *ctx, const char *dir, const char *cache_dir,
                              mnist_data_t *data, char *err, size_t errlen);

/* Opens this rank's reader for one epoch of `pattern` (shuffled with `seed` when shuffle != 0),
 * dropping the first skip_records records of that epoch. */
hora_result_t mnist_reader_open(hora_ctx_t *ctx, const char *pattern, int shuffle, uint64_t seed,
                                uint64_t epoch, uint64_t skip_records,
                                hora_records_reader_t **reader);

/* Reads up to n records (785 bytes each: label, 784 pixels) into x ([n][784] floats in [0, 1])
 * and labels. *got < n only at the end of the reader's data. HORA_ERR_DATA for a record of the
 * wrong size or a label > 9 (the message names it). */
hora_result_t mnist_read_batch(hora_records_reader_t *reader, size_t n, float *x, uint8_t *labels,
                               size_t *got, char *err, size_t errlen);

#endif
