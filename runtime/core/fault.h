/* Test-only fault injection (HORA_TEST_FAULT; fault.c). */
#ifndef HORA_CORE_FAULT_H
#define HORA_CORE_FAULT_H

#include "hora.h"

/* Called where `stage` (init, restore, reader, step, save, copy, finalize) begins on `rank`. With
 * HORA_TEST_FAULT unset: HORA_SUCCESS. When the variable names this stage and rank and this is
 * its NTH hit: exit/kill/segv end the process here, mute silences this rank's heartbeats and
 * returns HORA_SUCCESS, late silences them for 2 x HORA_PEER_TIMEOUT_S only (a first contact that
 * takes long), fail returns HORA_ERR_INTERNAL (the caller treats it as its own failure).
 * A malformed variable is HORA_ERR_INVALID_ARGUMENT. Thread-safe. */
hora_result_t hora__fault_hit(const char *stage, int rank);

/* 1 once a "mute" fault has fired, or while a "late" one lasts: the heartbeat thread does not send. */
int hora__fault_muted(void);

#endif
