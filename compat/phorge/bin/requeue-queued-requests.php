<?php

// Rollback helper. While delivery was delegated, new requests were handed
// over to gorge-webhook (marked in their properties) and got no
// HeraldWebhookWorker task, so after a rollback Phorge would never send them.
// Run this once delegation is off and gorge-webhook is stopped. For every
// "queued" webhook request that has no active task it:
//
//  - takes a handed-over request back (removes the marker), holding the
//    hook's lock, which gorge-webhook holds for each whole delivery, and only
//    if gorge-webhook is not in the middle of sending it (then it is left
//    alone and counted; run this again later);
//  - schedules a task, exactly like HeraldWebhookRequest::queueCall() does
//    for a new request.
//
// A request is never sent by both: gorge-webhook claims only marked rows, and
// the marker is removed with a compare-and-set that fails once gorge-webhook
// has claimed the row. Works with or without the kit installed in Phorge
// (after revert.sh it loads the kit's classes from this directory).
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

$kit_installed = class_exists('GorgeWebhookDelegation');
if (!$kit_installed) {
  // revert.sh removed the kit from Phorge (and with it the gorge.webhook.*
  // options, so nothing can be delegated): use this kit's copy for the
  // marker and the take-back.
  require_once dirname(__DIR__).
    '/src/extensions/gorge/GorgeWebhookDelegation.php';
}
if (!method_exists('GorgeWebhookDelegation', 'takeBack')) {
  fwrite(STDERR,
    "Phorge runs an older copy of the gorge kit: run apply.sh from this ".
    "kit first (or revert.sh, then run this again).\n");
  exit(1);
}

if ($kit_installed && GorgeWebhookDelegation::isDeliveryDelegated()) {
  fwrite(STDERR,
    "Delivery is still delegated (gorge.webhook.uri is set): turn it off ".
    "first (bin/config delete gorge.webhook.uri), restart the daemons and ".
    "stop gorge-webhook.\n");
  exit(1);
}

$table = new HeraldWebhookRequest();
$batch = 500;
$after = 0;
$counts = array(
  'queued' => 0,
  'had_task' => 0,
  'scheduled' => 0,
  'taken' => 0,
  'in-flight' => 0,
  'busy' => 0,
  'changed' => 0,
);

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
  $counts['queued'] += count($rows);

  $tasks = id(new PhabricatorWorkerActiveTask())->loadAllWhere(
    'taskClass = %s AND objectPHID IN (%Ls)',
    'HeraldWebhookWorker',
    mpull($rows, 'getPHID'));
  $with_task = array_fill_keys(mpull($tasks, 'getObjectPHID'), true);

  $by_hook = array();
  foreach ($rows as $row) {
    if (isset($with_task[$row->getPHID()])) {
      $counts['had_task']++;
      continue;
    }
    $by_hook[$row->getWebhookPHID()][] = $row;
  }

  foreach ($by_hook as $hook_phid => $hook_rows) {
    $handed_over = array();
    foreach ($hook_rows as $row) {
      if (GorgeWebhookDelegation::isHandedOver($row)) {
        $handed_over[] = $row;
      } else if ($dry_run) {
        echo "would schedule a task for {$row->getPHID()}\n";
        $counts['scheduled']++;
      } else {
        $row->queueCall();
        $counts['scheduled']++;
      }
    }
    if (!$handed_over) {
      continue;
    }
    if ($dry_run) {
      foreach ($handed_over as $row) {
        echo "would take {$row->getPHID()} back from gorge-webhook and ".
          "schedule a task\n";
      }
      $counts['taken'] += count($handed_over);
      continue;
    }

    // The lock Phorge's worker and gorge-webhook take for each delivery.
    $lock = PhabricatorGlobalLock::newLock('webhook('.$hook_phid.')');
    try {
      $lock->lock(30);
    } catch (PhutilLockException $ex) {
      $counts['busy'] += count($handed_over);
      continue;
    }
    try {
      foreach ($handed_over as $row) {
        $result = GorgeWebhookDelegation::takeBack($row, time());
        $counts[$result]++;
        if ($result === 'taken') {
          $row->queueCall();
          $counts['scheduled']++;
        }
      }
    } finally {
      $lock->unlock();
    }
  }
} while (count($rows) === $batch);

printf(
  "%d queued webhook requests: %d already had a task, %s %d (%d of them ".
  "taken back from gorge-webhook).\n",
  $counts['queued'],
  $counts['had_task'],
  $dry_run ? 'would schedule' : 'scheduled',
  $dry_run ? $counts['scheduled'] + $counts['taken'] : $counts['scheduled'],
  $counts['taken']);
$left = $counts['in-flight'] + $counts['busy'];
if ($left) {
  printf(
    "%d handed-over requests were left alone: %d claimed by gorge-webhook ".
    "less than %d s ago and not finished, %d whose hook stayed locked for ".
    "30 s. Is gorge-webhook still running? Stop it, then run this again.\n",
    $left,
    $counts['in-flight'],
    GorgeWebhookDelegation::IN_FLIGHT_WINDOW,
    $counts['busy']);
  exit(3);
}
