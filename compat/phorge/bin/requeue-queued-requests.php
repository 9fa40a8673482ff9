<?php

// Rollback helper. Rows queued while delivery was delegated have no
// HeraldWebhookWorker task, so after a rollback Phorge would never send them.
// Run this once delegation is off and gorge-webhook is stopped: it schedules a
// task for every "queued" webhook request that has no active task, exactly
// like HeraldWebhookRequest::queueCall() does for a new one.
//
// Usage: php requeue-queued-requests.php <phorge root> [--dry-run]

$args = array_slice($argv, 1);
$dry_run = in_array('--dry-run', $args, true);
$args = array_values(array_diff($args, array('--dry-run')));
if (count($args) !== 1) {
  fwrite(STDERR, "usage: php requeue-queued-requests.php <phorge root> ".
    "[--dry-run]\n");
  exit(2);
}

$init = rtrim($args[0], '/').'/scripts/init/init-script.php';
if (!is_file($init)) {
  fwrite(STDERR, "not a Phorge tree: {$init} is missing\n");
  exit(2);
}
require_once $init;

// Without the kit installed (revert.sh ran) nothing can be delegated.
if (class_exists('GorgeWebhookDelegation') &&
    GorgeWebhookDelegation::isDeliveryDelegated()) {
  fwrite(STDERR,
    "Delivery is still delegated (gorge.webhook.uri is set): turn it off ".
    "first (bin/config delete gorge.webhook.uri), restart the daemons and ".
    "stop gorge-webhook; otherwise both would send these rows.\n");
  exit(1);
}

$table = new HeraldWebhookRequest();
$batch = 500;
$after = 0;
$queued = 0;
$had_task = 0;
$scheduled = 0;

do {
  // Served by key_status (status, id).
  $rows = $table->loadAllWhere(
    'status = %s AND id > %d ORDER BY id ASC LIMIT %d',
    HeraldWebhookRequest::STATUS_QUEUED,
    $after,
    $batch);
  if (!$rows) {
    break;
  }
  $after = max(mpull($rows, 'getID'));
  $queued += count($rows);

  $tasks = id(new PhabricatorWorkerActiveTask())->loadAllWhere(
    'taskClass = %s AND objectPHID IN (%Ls)',
    'HeraldWebhookWorker',
    mpull($rows, 'getPHID'));
  $with_task = array_fill_keys(mpull($tasks, 'getObjectPHID'), true);

  foreach ($rows as $row) {
    if (isset($with_task[$row->getPHID()])) {
      $had_task++;
      continue;
    }
    if ($dry_run) {
      echo "would schedule a task for {$row->getPHID()}\n";
    } else {
      $row->queueCall();
    }
    $scheduled++;
  }
} while (count($rows) === $batch);

printf(
  "%d queued webhook requests: %d already had a task, %s %d.\n",
  $queued,
  $had_task,
  $dry_run ? 'would schedule' : 'scheduled',
  $scheduled);
